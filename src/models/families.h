// The model families qkv reads and writes in Hugging Face's layout (gpt2, llama, bert, marian),
// one record each in src/models/hf.cpp: its config.json keys, the checkpoint names of every
// parameter, its layer stacks, and what an exported config must satisfy. Other readers of the same
// families take their names from here: the GGUF reader renames llama's. Not installed.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "qkv/config.h"

namespace qkv::family {

// One tensor of a checkpoint as a parameter needs it: its name, the shape it must have in the
// file, and whether it is stored transposed (GPT-2's Conv1D keeps weights as (in, out)).
struct Part {
  std::string name;
  std::vector<int64_t> shape;
  bool transpose = false;
  bool flat = false;  // read as the parameter's elements whatever the file's shape (Marian's (1, V) bias)
};

// A parameter made of parts stacked along its first dimension (one part: the tensor itself).
struct Rule {
  std::string param;
  std::vector<Part> parts;
};

// The rules of family `type` for config `c`, the checkpoint's names under `prefix`; the names a
// checkpoint may hold that no rule reads (buffers, tied copies) are added to `ignore`. An unknown
// type is an error naming the families.
std::vector<Rule> rules(const std::string& type, const ModelConfig& c, const std::string& prefix,
                        std::set<std::string>* ignore = nullptr);

}  // namespace qkv::family

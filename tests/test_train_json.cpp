// train.json as `qkv train --resume` reads it back (src/train/train_json.cpp).
#include "train/train_json.h"

#include <gtest/gtest.h>

#include <string>

#include "error_testing.h"

namespace qkv {
namespace {

using testing::error_of;

TEST(TrainJson, ReadsWhatQkvTrainWrites) {
  RunOptions o;
  o.data = "given.tsv";
  read_train_json(R"({"task": "lm", "data": "kjv.txt", "source": "", "target": "", "preset": "small",
                      "config": "", "tokenizer": "", "spm_type": "unigram", "vocab": 0, "max_tokens": 6144,
                      "max_len": 256, "valid_fraction": 0.02, "test_fraction": 0, "seed": 18446744073709551615,
                      "lr": 0.0, "warmup": -1, "dropout": -1.0, "label_smoothing": -1.0, "eval_every": 0,
                      "subword_alpha": 0.5})",
                  "train.json", o);
  EXPECT_EQ(o.task, "lm");
  EXPECT_EQ(o.data, "kjv.txt");
  EXPECT_EQ(o.preset, "small");
  EXPECT_EQ(o.max_tokens, 6144);
  EXPECT_EQ(o.max_len, 256);
  EXPECT_EQ(o.eval_every, 0);
  EXPECT_EQ(o.test_fraction, 0);
  EXPECT_EQ(o.seed, UINT64_MAX);
  EXPECT_EQ(o.subword_alpha, 0.5);
  // Absent keys keep what was given.
  RunOptions p;
  p.data = "given.tsv";
  read_train_json("{}", "train.json", p);
  EXPECT_EQ(p.data, "given.tsv");
  EXPECT_EQ(p.seed, 1u);
  EXPECT_FALSE(p.data_files_given);
}

// The data files' identity, which --resume compares with the files as they are now.
TEST(TrainJson, DataFilesAreReadAndChecked) {
  RunOptions o;
  read_train_json(R"({"data_files": [{"path": "a.tsv", "bytes": 400, "fnv1a64": "49f0d93e1fc1f3f5"}]})", "t.json", o);
  ASSERT_TRUE(o.data_files_given);
  ASSERT_EQ(o.data_files.size(), 1u);
  EXPECT_EQ(o.data_files[0].path, "a.tsv");
  EXPECT_EQ(o.data_files[0].bytes, 400u);
  EXPECT_EQ(o.data_files[0].fnv1a64, "49f0d93e1fc1f3f5");
  for (const char* bad : {R"({"data_files": {}})", R"({"data_files": [1]})",
                          R"({"data_files": [{"path": "a", "bytes": -1, "fnv1a64": "49f0d93e1fc1f3f5"}]})",
                          R"({"data_files": [{"path": "a", "bytes": 1, "fnv1a64": "49F0D93E1FC1F3F5"}]})",
                          R"({"data_files": [{"path": "a", "bytes": 1, "fnv1a64": "123"}]})",
                          R"({"data_files": [{"path": "a", "bytes": 1, "fnv1a64": "49f0d93e1fc1f3f5", "x": 1}]})"}) {
    RunOptions r;
    EXPECT_NE(error_of([&] { read_train_json(bad, "t.json", r); }).find("t.json: "), std::string::npos) << bad;
    EXPECT_NE(error_of([&] { read_train_json(bad, "t.json", r); }).find("\"data_files\""), std::string::npos) << bad;
  }
}

// What tells a replaced tokenizer: the run's --init and the size of the tokenizer it started with,
// read back but never applied.
TEST(TrainJson, InitAndTokenizerSizeAreReadBack) {
  RunOptions o;
  read_train_json(R"({"init": "gpt2-folder", "tokenizer_vocab": 50257})", "t.json", o);
  EXPECT_EQ(o.init_recorded, "gpt2-folder");
  EXPECT_EQ(o.tokenizer_vocab, 50257);
  RunOptions old;  // written before tokenizer_vocab existed
  read_train_json("{}", "t.json", old);
  EXPECT_EQ(old.tokenizer_vocab, 0);
  EXPECT_TRUE(old.init_recorded.empty());
  for (const char* bad : {R"({"tokenizer_vocab": -3})", R"({"tokenizer_vocab": 4294967296})",
                          R"({"tokenizer_vocab": "300"})", R"({"init": 7})"}) {
    RunOptions r;
    const std::string e = error_of([&] { read_train_json(bad, "t.json", r); });
    EXPECT_NE(e.find("t.json: \""), std::string::npos) << bad << " -> " << e;
  }
}

TEST(TrainJson, ErrorsNameTheFileAndKey) {
  const auto error = [](const std::string& text) {
    RunOptions o;
    return error_of([&] { read_train_json(text, "d/train.json", o); });
  };
  EXPECT_NE(error("[1]").find("d/train.json: expected a JSON object, found array"), std::string::npos);
  EXPECT_NE(error("{").find("d/train.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error(std::string("{}") + '\0' + "x").find("NUL byte at offset 2"), std::string::npos);
  EXPECT_NE(error(R"({"seed": 1, "seed": 2})").find("d/train.json: duplicate key \"seed\""), std::string::npos);
  EXPECT_NE(error(R"({"task": 3})").find("\"task\" is 3 (expected a string)"), std::string::npos);
  EXPECT_NE(error(R"({"task": "summarise"})").find("expected one of translate, lm, classify"), std::string::npos);
  EXPECT_NE(error(R"({"preset": "huge"})").find("expected one of tiny, small, base"), std::string::npos);
  EXPECT_NE(error(R"({"max_tokens": 1.5})").find("\"max_tokens\" is 1.5 (expected 0 or an integer from 1 to 16777216)"),
            std::string::npos);
  EXPECT_NE(error(R"({"max_tokens": 4611686018427387904})").find("\"max_tokens\""), std::string::npos);
  EXPECT_NE(error(R"({"max_len": 1})").find("\"max_len\" is 1 (expected 0 or an integer from 2"), std::string::npos);
  EXPECT_NE(error(R"({"eval_every": -1})").find("\"eval_every\" is -1"), std::string::npos);
  EXPECT_NE(error(R"({"valid_fraction": 0.9})").find("\"valid_fraction\" is 0.9 (expected a number from 0 to 0.5)"),
            std::string::npos);
  EXPECT_NE(error(R"({"seed": -1})").find("\"seed\" is -1 (expected an integer from 0 to 2^64-1)"), std::string::npos);
  EXPECT_NE(error(R"({"seed": "1"})").find("\"seed\" is \"1\""), std::string::npos);
  EXPECT_NE(error(R"({"subword_alpha": 1.5})").find("\"subword_alpha\" is 1.5 (expected 0 or a number in (0, 1])"),
            std::string::npos);
  EXPECT_NE(error(R"({"subword_alpha": "0.1"})").find("\"subword_alpha\" is \"0.1\""), std::string::npos);
}

}  // namespace
}  // namespace qkv

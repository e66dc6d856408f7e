// task.json: TaskInfo::load(dir), which reads dir/task.json. An accepted file survives save +
// load unchanged.
#include "fuzz_util.h"
#include "qkv/task.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qkv;
  const std::string in = fuzz::bytes(data, size);
  fuzz::put_file("task.json", in);
  TaskInfo t;
  if (!fuzz::accepts([&] { t = TaskInfo::load(fuzz::scratch_dir()); })) return 0;
  if (in.find('\0') != std::string::npos) fuzz::finding("task.json with a NUL byte accepted (the rest is ignored)");
  if (fuzz::json_repeats_a_key(in)) fuzz::finding("task.json with a repeated key accepted");
  t.save(fuzz::scratch_dir());
  const TaskInfo back = TaskInfo::load(fuzz::scratch_dir());
  if (back.task != t.task || back.labels != t.labels || back.max_len != t.max_len)
    fuzz::finding("an accepted task.json does not survive save + load");
  return 0;
}

// A checkpoint survives a kill at any moment: a child process trains and overwrites its
// checkpoint in a loop and is killed with SIGKILL at varying moments (often mid-write); after
// every kill the checkpoint must load, and its step must never go backwards.
//
// Its own executable: the parent never starts OpenMP threads (GNU OpenMP is not fork-safe once
// its pool exists); only the forked children train.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "file_testing.h"
#include "qkv/model.h"
#include "qkv/train.h"

namespace qkv {
namespace {

ModelConfig config() {
  ModelConfig c;
  c.arch = Arch::Decoder;
  c.vocab_size = 64;
  c.d_model = 128;
  c.n_heads = 4;
  c.d_ff = 512;
  c.n_layers = 4;
  c.positional = Positional::Learned;
  c.max_len = 16;
  return c;  // about 0.8 M parameters: a 10 MB checkpoint, tens of milliseconds to write
}

[[noreturn]] void child_loop(const std::string& path) {
  Model m(checkpoint_model_config(path));
  Trainer t(m, TrainConfig{});
  t.load_checkpoint(path);
  Batch b;
  b.input = Tensor({2, 8}, DType::I64);
  b.target = Tensor({2, 8}, DType::I64);
  for (int64_t i = 0; i < 16; ++i) {
    b.input.data<int64_t>()[i] = (i * 7) % 64;
    b.target.data<int64_t>()[i] = (i * 11) % 64;
  }
  for (;;) {
    t.step({b});
    t.save_checkpoint(path, std::to_string(t.steps_done()));
  }
}

TEST(Checkpoint, SurvivesSigkillAtAnyMoment) {
  const testing::TempDir dir("kill");
  const std::string path = dir / "train.ckpt";
  {
    Model m(config());
    m.init(1);
    Trainer t(m, TrainConfig{});
    t.save_checkpoint(path, "0");
  }
  int64_t last_step = 0, kills_mid_run = 0;
  for (int round = 0; round < 12; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        child_loop(path);
      } catch (...) {
        ::_exit(3);
      }
    }
    // Wait until the child has replaced the checkpoint at least once (its first step can be slow
    // on a busy machine), then kill it after a varying delay, 0 .. 55 ms: a step plus a write
    // takes tens of milliseconds, so the kills land at different points of a write.
    const auto before = std::filesystem::last_write_time(path);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::filesystem::last_write_time(path) == before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ++kills_mid_run;
    Model m(checkpoint_model_config(path));
    Trainer t(m, TrainConfig{});
    std::string data;
    ASSERT_NO_THROW(data = t.load_checkpoint(path)) << "round " << round;
    EXPECT_EQ(data, std::to_string(t.steps_done()));
    EXPECT_GE(t.steps_done(), last_step) << "round " << round;
    last_step = t.steps_done();
  }
  EXPECT_EQ(kills_mid_run, 12);
  EXPECT_GT(last_step, 0) << "the children never completed a step";
  // A kill inside a write leaves that write's temporary file behind (the target is untouched).
  const int leftovers = static_cast<int>(dir.entries().size()) - 1;
  std::printf("12 kills, checkpoint loadable after each; reached step %lld; %d kills landed inside a write\n",
              static_cast<long long>(last_step), leftovers);
}

}  // namespace
}  // namespace qkv

// `qkv train` stopped by real signals at random moments: SIGINT, SIGTERM, two SIGINTs in a row,
// and a second SIGINT while it exits after saving, sent to the command-line tool while it trains. Every time it must exit with 130 (never a
// crash or an abort), leave a checkpoint that loads, and that checkpoint must resume.
// The tool's path comes from QKV_BIN (set by ctest).
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "file_testing.h"
#include "qkv/model.h"
#include "qkv/safetensors.h"
#include "qkv/train.h"

extern char** environ;

namespace qkv {
namespace {

using testing::read_bytes;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

std::string qkv_bin() {
  const char* b = std::getenv("QKV_BIN");
  return b ? b : "";
}

// Starts `args` with stdout and stderr into `log`.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // The child must not inherit an ignored SIGINT (a shell's background job would): default it.
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigdefault(&at, &defaults);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, &at, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  return rc == 0 ? pid : -1;
}

// Waits for `pid` up to `limit`; returns its wait status, or -1 (and kills it) on timeout.
int wait_for(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  int status = 0;
  while (Clock::now() < deadline) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

std::string describe(int status) {
  if (status == -1) return "did not exit within the time limit (a hang)";
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

std::string tail(const std::string& text, size_t n = 1500) { return text.size() > n ? text.substr(text.size() - n) : text; }

// A small translation corpus: numbers in words and digits, enough for many batches per epoch.
std::string corpus() {
  const char* words[] = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"};
  std::string s;
  std::mt19937 g(5);
  for (int i = 0; i < 600; ++i) {
    const int n = 1 + static_cast<int>(g() % 6);
    std::string a, b;
    for (int k = 0; k < n; ++k) {
      const int d = static_cast<int>(g() % 10);
      if (k) a += ' ';
      a += words[d];
      b += static_cast<char>('0' + d);
    }
    s += a + "\t" + b + "\n";
  }
  return s;
}

// The checkpoint loads (weights, AdamW state, RNG, a sane data position); returns its step.
int64_t load_checkpoint(const std::string& dir) {
  const std::string path = dir + "/checkpoint.safetensors";
  Model m(checkpoint_model_config(path));
  Trainer t(m, TrainConfig{});
  const nlohmann::json data = nlohmann::json::parse(t.load_checkpoint(path));
  EXPECT_GE(data.at("epoch").get<int64_t>(), 0);
  EXPECT_GE(data.at("batch").get<int64_t>(), 0);
  Model::load(dir);  // and the model directory's weights
  return t.steps_done();
}

TEST(TrainSignals, EveryStopExits130WithALoadableCheckpoint) {
  const std::string bin = qkv_bin();
  ASSERT_FALSE(bin.empty()) << "QKV_BIN is not set (run through ctest)";
  TempDir dir("signals");
  const std::string data = dir / "pairs.tsv";
  testing::write_bytes(data, corpus());
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 g(seed);
  std::printf("delays from seed %u\n", seed);
  const int rounds = 12;
  for (int round = 0; round < rounds; ++round) {
    const std::string out = dir / ("run" + std::to_string(round)), log = dir / ("run" + std::to_string(round) + ".log");
    // 0: SIGINT, 1: SIGTERM, 2: SIGINT twice, 3: SIGINT, and another once the checkpoint is saved
    const int kind = round % 4;
    const pid_t pid = spawn({bin, "--threads", "2", "train", "--task", "translate", "--data", data, "--out", out,
                             "--tokenizer", "byte", "--preset", "tiny", "--max-len", "48", "--max-tokens", "400",
                             "--steps", "100000", "--eval-every", "7", "--seed", std::to_string(round + 1)},
                            log);
    ASSERT_GT(pid, 0) << "cannot start " << bin;
    // Once setup is done (the model line), stop it after a random delay: before the first step,
    // mid-step, mid-validation or mid-checkpoint.
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (read_bytes(log).find(" parameters, ") == std::string::npos && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int delay_ms = static_cast<int>(g() % 2500);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, kind == 1 ? SIGTERM : SIGINT);
    if (kind == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(g() % 100)));
      ::kill(pid, SIGINT);
    }
    if (kind == 3) {  // while it winds down (a zombie, if it has exited already, ignores it)
      const auto until = Clock::now() + std::chrono::seconds(120);
      while (read_bytes(log).find("checkpoint saved") == std::string::npos && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ::kill(pid, SIGINT);
    }
    const int status = wait_for(pid, std::chrono::seconds(300));
    const std::string text = read_bytes(log);
    const char* sig = kind == 1   ? "SIGTERM"
                      : kind == 2 ? "two SIGINTs"
                      : kind == 3 ? "SIGINT, and another after the checkpoint"
                                  : "SIGINT";
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 130)
        << "round " << round << " (" << sig << " after " << delay_ms << " ms): " << describe(status) << "\n"
        << tail(text);
    EXPECT_NE(text.find("checkpoint saved"), std::string::npos) << tail(text);
    int64_t step = 0;
    ASSERT_NO_THROW(step = load_checkpoint(out)) << "round " << round << ": the checkpoint does not load";
    // The last round resumes its checkpoint for a few steps.
    if (round == rounds - 1) {
      const pid_t again = spawn({bin, "--threads", "2", "train", "--out", out, "--resume", "--steps",
                                 std::to_string(step + 3)},
                                log + ".resume");
      const int st = wait_for(again, std::chrono::seconds(300));
      ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
          << "resume: " << describe(st) << "\n" << tail(read_bytes(log + ".resume"));
      EXPECT_EQ(load_checkpoint(out), step + 3);
    }
  }
}

}  // namespace
}  // namespace qkv

// Whole-file reading and writing (qkv/files.h): only regular files are read or replaced;
// symbolic links are followed, devices and FIFOs with a reader written through, and nothing
// ever waits on a FIFO.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "error_testing.h"
#include "file_testing.h"
#include "qkv/files.h"
#include "qkv/safetensors.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Files, WritingThroughASymlinkReplacesItsTargetAndKeepsTheLink) {
  TempDir dir("files_link");
  write_bytes(dir / "real.txt", "old");
  fs::create_symlink("real.txt", dir / "link.txt");  // relative, from the link's directory
  write_file_atomic(dir / "link.txt", "new");
  EXPECT_TRUE(fs::is_symlink(dir / "link.txt"));
  EXPECT_EQ(read_bytes(dir / "real.txt"), "new");
  // a chain of links, and a dangling link (its target is created)
  fs::create_symlink(dir / "link.txt", dir / "link2.txt");
  write_file_atomic(dir / "link2.txt", "newer");
  EXPECT_TRUE(fs::is_symlink(dir / "link2.txt"));
  EXPECT_EQ(read_bytes(dir / "real.txt"), "newer");
  fs::create_symlink("absent.txt", dir / "dangling.txt");
  write_file_atomic(dir / "dangling.txt", "made");
  EXPECT_TRUE(fs::is_symlink(dir / "dangling.txt"));
  EXPECT_EQ(read_bytes(dir / "absent.txt"), "made");
  // a loop of links is an error, not a hang
  fs::create_symlink("loop_b", dir / "loop_a");
  fs::create_symlink("loop_a", dir / "loop_b");
  EXPECT_TRUE(contains(error_of([&] { write_file_atomic(dir / "loop_a", "x"); }), "levels of symbolic links"));
  // no temporary file is left anywhere
  for (const std::string& name : dir.entries()) EXPECT_FALSE(contains(name, ".tmp.")) << name;
}

TEST(Files, DevicesAreWrittenThroughNeverReplaced) {
  write_file_atomic("/dev/null", "into the void");
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "/dev/null was replaced";
}

TEST(Files, AFifoIsNeverWaitedOn) {
  TempDir dir("files_fifo");
  const std::string fifo = dir / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  // reading: refused at once (no writer needed for the non-blocking open)
  EXPECT_TRUE(contains(error_of([&] { read_file(fifo, "tokenizer.json"); }), "is a FIFO (named pipe), not a regular file"));
  EXPECT_TRUE(contains(error_of([&] { read_safetensors(fifo); }), "is a FIFO"));
  // writing without a reader: an error, not a wait
  EXPECT_TRUE(contains(error_of([&] { write_file_atomic(fifo, "x"); }), "FIFO (named pipe) with no reader"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // with a reader: written through, the FIFO stays a FIFO
  std::string got;
  std::thread reader([&] {
    const int fd = ::open(fifo.c_str(), O_RDONLY);
    char buf[64];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
    ::close(fd);
  });
  std::string err = "not tried";
  for (int attempt = 0; attempt < 500 && err != "no exception"; ++attempt) {
    err = error_of([&] { write_file_atomic(fifo, "through the pipe"); });
    if (err != "no exception") std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (err != "no exception") ::close(::open(fifo.c_str(), O_WRONLY));  // let the reader go
  reader.join();
  EXPECT_EQ(err, "no exception");
  EXPECT_EQ(got, "through the pipe");
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST(Files, OnlyRegularFilesAreRead) {
  TempDir dir("files_read");
  EXPECT_TRUE(contains(error_of([&] { read_file(dir.path().string(), "config.json"); }), "is a directory"));
  EXPECT_TRUE(contains(error_of([] { read_file("/dev/zero", ".npy file"); }), "is a character device"));
  EXPECT_TRUE(contains(error_of([&] { read_file(dir / "absent", "task.json"); }), "cannot open task.json"));
  EXPECT_TRUE(contains(error_of([&] { write_file_atomic(dir.path().string(), "x"); }), "it is a directory"));
  write_bytes(dir / "ok.txt", "fine");
  EXPECT_EQ(read_file(dir / "ok.txt", "text"), "fine");
}

TEST(Files, StaleTemporaryFilesOfDeadWritersAreRemoved) {
  TempDir dir("files_stale");
  const std::string dead = "checkpoint.safetensors.tmp.4194304.0123456789abcdef";  // above pid_max
  const std::string alive = "model.safetensors.tmp." + std::to_string(::getpid()) + ".fedcba9876543210";
  const std::string not_ours = "notes.tmp.12.short";
  const std::string plain = "model.safetensors";
  for (const std::string& f : {dead, alive, not_ours, plain}) write_bytes(dir / f, "x");
  fs::create_directory(dir / "dir.tmp.4194304.0123456789abcdef");  // not a regular file: kept
  EXPECT_EQ(remove_stale_temp_files(dir.path().string()), 1);
  EXPECT_FALSE(fs::exists(dir / dead));
  for (const std::string& f : {alive, not_ours, plain}) EXPECT_TRUE(fs::exists(dir / f)) << f;
  EXPECT_TRUE(fs::exists(dir / "dir.tmp.4194304.0123456789abcdef"));
  EXPECT_EQ(remove_stale_temp_files(dir / "absent"), 0);
}

}  // namespace
}  // namespace qkv

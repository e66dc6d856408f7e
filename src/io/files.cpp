// Whole-file reading and writing (qkv/files.h): regular files only for reading, atomic
// replacement only of regular files, symbolic links followed, FIFOs never waited on.
#include "qkv/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "qkv/error.h"

namespace qkv {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Bits for temporary file names: the random device when it works, mixed with the clock and a counter.
uint64_t random_bits() {
  static std::atomic<uint64_t> counter{0};
  uint64_t r = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (counter.fetch_add(1) + 1) * 0x9e3779b97f4a7c15ull;
  try {
    std::random_device rd;
    r ^= (static_cast<uint64_t>(rd()) << 32) | rd();
  } catch (const std::exception&) {
    // No entropy source: the clock and the counter still differ between calls.
  }
  return r;
}

constexpr const char* kTempMark = ".tmp.";
constexpr size_t kTempHexDigits = 16;

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// The path a write to `path` lands on: symbolic links followed (relative targets from the link's
// own directory), so that the link itself is never replaced. A link under /proc (/proc/self/fd/1,
// where /dev/stdout leads) names an open file, not a path (a pipe's reads "pipe:[123]"): the chain
// stops there and *magic is set; such a file is opened through the link, never replaced.
std::string resolve_links(const std::string& path, bool* magic) {
  std::string p = path;
  *magic = false;
  for (int hop = 0; hop < 40; ++hop) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    if (p.rfind("/proc/", 0) == 0) {
      *magic = true;
      return p;
    }
    std::string target(PATH_MAX, '\0');
    const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0) fail(path, ": cannot write: cannot read the symbolic link ", p, ": ", errno_text(errno));
    target.resize(static_cast<size_t>(n));
    if (target.empty()) fail(path, ": cannot write: the symbolic link ", p, " is empty");
    p = target[0] == '/' ? target : parent_dir(p) + "/" + target;
  }
  fail(path, ": cannot write: more than 40 levels of symbolic links");
}

// Every piece, in order; 0, or the errno of the write that failed.
int write_pieces(int fd, const std::vector<std::string_view>& pieces) {
  for (const std::string_view bytes : pieces) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t put = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) return errno;
      done += static_cast<size_t>(put);
    }
  }
  return 0;
}

void write_all(int fd, const std::vector<std::string_view>& pieces, const std::string& path) {
  if (const int err = write_pieces(fd, pieces); err != 0) {
    ::close(fd);
    fail(path, ": cannot write: ", errno_text(err));
  }
}

// A device or a FIFO (or a regular file known only through /proc): written through in place,
// never replaced. A FIFO without a reader is an
// error at once (opening it non-blocking fails), not a wait.
void write_through(const std::string& target, const std::string& shown, const std::vector<std::string_view>& bytes,
                   mode_t mode) {
  const bool fifo = S_ISFIFO(mode);
  const int fd = ::open(target.c_str(),
                        O_WRONLY | O_CLOEXEC | O_NOCTTY | (fifo ? O_NONBLOCK : 0) | (S_ISREG(mode) ? O_TRUNC : 0));
  if (fd < 0) {
    if (fifo && errno == ENXIO) fail(shown, ": cannot write: it is a FIFO (named pipe) with no reader");
    fail(shown, ": cannot write to ", file_kind(mode), ": ", errno_text(errno));
  }
  if (fifo) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  }
  write_all(fd, bytes, shown);
  if (::close(fd) != 0) fail(shown, ": cannot write: close failed: ", errno_text(errno));
}

}  // namespace

const char* file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

int open_regular_file(const std::string& path, const std::string& what) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below anyway.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail(path, ": cannot open ", what, ": ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, ": cannot stat ", what, ": ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": ", what, " is ", file_kind(st.st_mode), ", not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_file(const std::string& path, const std::string& what) {
  const int fd = open_regular_file(path, what);
  struct stat st {};
  std::string bytes;
  if (::fstat(fd, &st) == 0) bytes.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      fail(path, ": cannot read ", what, ": ", errno_text(err));
    }
    if (got == 0) break;
    bytes.append(buf, static_cast<size_t>(got));
  }
  ::close(fd);
  return bytes;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_file_atomic(path, std::vector<std::string_view>{bytes});
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& bytes) {
  bool magic = false;
  const std::string target = resolve_links(path, &magic);
  struct stat st {};
  if (magic) {
    if (::stat(target.c_str(), &st) != 0) fail(path, ": cannot write: ", errno_text(errno));
    if (S_ISDIR(st.st_mode)) fail(path, ": cannot write: it is ", file_kind(st.st_mode));
    write_through(target, path, bytes, st.st_mode);
    return;
  }
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISFIFO(st.st_mode)) {
      write_through(target, path, bytes, st.st_mode);
      return;
    }
    fail(path, ": cannot write: it is ", file_kind(st.st_mode), " (only regular files are replaced)");
  }
  // A temporary name no other writer uses: target + ".tmp.<pid>.<random>", created exclusively.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    char suffix[64];
    std::snprintf(suffix, sizeof suffix, "%s%ld.%016llx", kTempMark, static_cast<long>(::getpid()),
                  static_cast<unsigned long long>(random_bits()));
    tmp = target + suffix;
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && (errno != EEXIST || attempt == 10))
      fail(path, ": cannot write: cannot create temporary file ", tmp, ": ", errno_text(errno));
  }
  // From here on, any failure removes the temporary file; the target is untouched until rename.
  auto abandon = [&](const char* step, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(detail::concat(path, ": cannot write: ", step, " failed: ", errno_text(err)));
  };
  if (const int err = write_pieces(fd, bytes); err != 0) abandon("write", err);
  if (::fsync(fd) != 0) abandon("fsync", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(detail::concat(path, ": cannot write: close failed: ", errno_text(err)));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(detail::concat(path, ": cannot write: rename from ", tmp, " failed: ", errno_text(err)));
  }
  // Make the rename itself durable; a directory that cannot be synced is not an error.
  const int dfd = ::open(parent_dir(target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

int64_t remove_stale_temp_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int64_t removed = 0;
  while (const dirent* e = ::readdir(d)) {
    // name <- "<file>.tmp.<pid>.<16 hex digits>"
    const std::string name = e->d_name;
    const size_t mark = name.rfind(kTempMark);
    if (mark == std::string::npos || mark == 0) continue;
    const size_t pid_at = mark + std::strlen(kTempMark), dot = name.find('.', pid_at);
    if (dot == std::string::npos || dot == pid_at || dot - pid_at > 10 || name.size() - dot - 1 != kTempHexDigits)
      continue;
    bool ok = true;
    for (size_t i = pid_at; i < dot; ++i) ok = ok && name[i] >= '0' && name[i] <= '9';
    for (size_t i = dot + 1; i < name.size(); ++i) ok = ok && std::isxdigit(static_cast<unsigned char>(name[i]));
    if (!ok) continue;
    const long pid = std::strtol(name.c_str() + pid_at, nullptr, 10);
    if (pid <= 0 || pid > INT_MAX) continue;
    // Only a file whose writer is gone: a live process (ours included) may still rename it.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const std::string full = dir + "/" + name;
    struct stat st {};
    if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(full.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace qkv

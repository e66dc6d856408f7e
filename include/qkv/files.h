// qkv/files.h: reading and writing whole files, never trusting what is at a path.
//
// Reading: only regular files. A FIFO, a device or a socket is refused at once (opened without
// blocking, so a FIFO with no writer cannot hang the reader), as is a directory.
// Writing: a regular file (or a new path) is replaced atomically: a temporary file in the same
// directory, fsync, rename. A symbolic link is followed to its real target, which is written (the
// link stays a link). Anything else at the path is never replaced: a character device such as
// /dev/null or /dev/stdout is written through; a FIFO is written through when it has a reader;
// a directory or a socket is refused.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

// Writes `bytes` to `path` (see above). Errors name the path.
void write_file_atomic(const std::string& path, const std::string& bytes);
// The same for the concatenation of `pieces` (a large file written without first copying it
// into one string).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// The whole file. Errors name the path and `what` it should be ("tokenizer.json", ".npy file"):
// cannot open, not a regular file (saying what it is), or a failed read.
std::string read_file(const std::string& path, const std::string& what);

// A file descriptor of the regular file at `path`, opened read-only without ever blocking on it;
// errors as read_file's. The caller closes it.
int open_regular_file(const std::string& path, const std::string& what);

// "a directory", "a FIFO (named pipe)", "a character device", ... for a stat st_mode.
const char* file_kind(unsigned mode);

// Removes the temporary files that write_file_atomic left in `dir` when its process was killed
// (names "<file>.tmp.<pid>.<16 hex digits>" whose process no longer exists). Returns how many
// were removed; a directory that cannot be listed removes nothing.
int64_t remove_stale_temp_files(const std::string& dir);

}  // namespace qkv

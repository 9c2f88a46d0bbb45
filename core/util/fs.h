// fs.h: file-system operations on the run directory that never follow a symbolic link out of it.
// A checkpoint or a stale temporary directory may be a symlink (a user moved a checkpoint to other storage
// and linked it back): removing it removes the link, never the files it points at.
#pragma once
#include <stddef.h>

// mkdir -p: creates path and its missing parents (0755). One-line error on failure.
void make_dirs(const char* path);
// Removes path if it exists: a file or a symlink is unlinked; a directory is emptied depth-first (its
// symlinks unlinked, not followed) and removed. One-line error on failure.
void remove_path(const char* path);
// 1 if path exists as an entry (lstat: a dangling symlink counts), else 0.
int path_exists(const char* path);
// fsync of a directory, so a rename or a new entry in it survives a crash.
void sync_dir(const char* path);
// An fcntl write lock (not flock, so that it also holds on NFS) on the file at path, created if missing,
// into which this process's pid is written: held while the returned descriptor is open, released when the
// process ends, however it ends. -1 when another process holds it; *holder is then its pid (-1 unknown).
int lock_file(const char* path, long* holder);
// Bytes an unprivileged write can still take on the filesystem of path, or of its nearest existing ancestor
// when path does not exist yet (the largest value for a filesystem without a size, such as ramfs). One-line
// error when neither can be inspected.
unsigned long long fs_free_bytes(const char* path);
// Bytes of disk the regular file at path takes (its allocated blocks); 0 if it does not exist.
unsigned long long file_disk_bytes(const char* path);

// For inspecting files without exiting (why: the problem, of why_size bytes). The regular file dir/name (a
// FIFO would block its reader, a directory has no bytes): 1 and its size, else 0.
int regular_file_size(const char* dir, const char* name, long long* size, char* why, size_t why_size);
// The whole text of the regular file dir/name, NUL-terminated, of 1 byte to 1 MiB: malloc'ed, else NULL.
char* read_small_text(const char* dir, const char* name, char* why, size_t why_size);

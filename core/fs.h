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

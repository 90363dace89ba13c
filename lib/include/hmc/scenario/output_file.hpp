#pragma once
// Where hmc-run writes what it was asked to (--report, --trace, a rank's result file), and
// nothing else:
// - "-" is standard output;
// - a path that exists and is not a regular file (a FIFO, a character device, a symlink to a
//   stream such as /dev/stdout = /proc/self/fd/1) is opened and written directly: never renamed
//   over, never unlinked;
// - otherwise (a regular file, or a new name) the text goes to a unique temporary file in the
//   same folder that is then renamed over the path, so a reader never sees half a file and two
//   runs writing the same path do not clobber each other's temporary file.
// Errors are hmc::RuntimeError "cannot write PATH: <OS reason>" naming the path asked for.

#include <string>

namespace hmc::scenario {

// Whether `path` can be written, checked before a run so that a long run's results are not
// lost at the end: "" when it can, else why not ("cannot write out/r.json: the folder out does
// not exist"). Creates nothing.
std::string checkOutputPath(const std::string& path);

// Writes `text` to `path` as described above.
void writeOutputFile(const std::string& path, const std::string& text);

}  // namespace hmc::scenario

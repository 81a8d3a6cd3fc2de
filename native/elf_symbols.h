// Reads what tritonpatch needs from an ELF64 shared object with plain file reads (an mmap of
// libtriton.so would add a second offset-0 mapping of the library): named symbols, vtables, the
// sizes of data objects and the GNU build ID.
//
// The path a library was loaded from can name a different file later (`pip install -U triton`
// under a running process replaces it), so the symbols of a loaded library are read from the
// mapped file itself, through /proc/self/map_files, and the file read is checked against the
// image in memory (GNU build ID, else device and inode). A file that cannot be confirmed to be the
// loaded image is refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace tritonpatch {

struct ElfSymbol {
  uint64_t value = 0;  // st_value: offset from the library's load bias
  uint64_t size = 0;
};

struct ElfSymbols {
  // The exactly-named symbols that were asked for and found.
  std::unordered_map<std::string, ElfSymbol> named;
  // Every vtable (`_ZTV...`) in .symtab: st_value -> name. Used to recognise option types.
  std::map<uint64_t, std::string> vtables;
  // Every sized data object (STT_OBJECT) in .symtab: st_value -> st_size. Gives sizeof of the
  // option objects, whose last member is the callback.
  std::unordered_map<uint64_t, uint64_t> object_sizes;
  // The NT_GNU_BUILD_ID note's bytes; empty when the file has none.
  std::string build_id;
};

// Throws std::runtime_error when the file cannot be read, is not ELF64, or has no .symtab
// (a stripped library). `label` names the library in messages (`path` may be a /proc link).
ElfSymbols read_elf_symbols(const std::string &path, const std::string &label,
                            const std::unordered_set<std::string> &wanted);

// The NT_GNU_BUILD_ID bytes in a PT_NOTE segment's contents; empty when there is none.
std::string find_build_id(const char *notes, size_t size);

struct LoadedLibrary {
  std::string path;      // the file the loader opened (link_map l_name)
  uintptr_t load_bias;   // link_map l_addr
  std::string elf_path;  // where to read the loaded file: a /proc/self/map_files link, or `path`
  std::string build_id;  // NT_GNU_BUILD_ID of the image in memory; empty when it has none
};

// Throws std::runtime_error when `path` is not loaded in this process, or when only the path
// can be read and it no longer holds the loaded file.
LoadedLibrary find_loaded_library(const std::string &path);

// Throws std::runtime_error unless `file_build_id` (read from lib.elf_path) is the image's.
void check_file_is_loaded_image(const LoadedLibrary &lib, const std::string &file_build_id);

}  // namespace tritonpatch

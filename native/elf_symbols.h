// Reads the symbols tritonpatch needs from an ELF64 shared object's .symtab, with plain file
// reads (an mmap of libtriton.so would add a second offset-0 mapping of the library).
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
};

// Throws std::runtime_error when the file cannot be read, is not ELF64, or has no .symtab
// (a stripped library).
ElfSymbols read_elf_symbols(const std::string &path, const std::unordered_set<std::string> &wanted);

}  // namespace tritonpatch

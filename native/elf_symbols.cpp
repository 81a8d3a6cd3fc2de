#include "elf_symbols.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <vector>

namespace tritonpatch {
namespace {

class File {
 public:
  explicit File(const std::string &path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  }
  ~File() { ::close(fd_); }
  File(const File &) = delete;
  File &operator=(const File &) = delete;

  void read_at(uint64_t offset, void *out, size_t size) const {
    auto *dst = static_cast<char *>(out);
    while (size > 0) {
      ssize_t got = ::pread(fd_, dst, size, static_cast<off_t>(offset));
      if (got <= 0) throw std::runtime_error("short read from " + path_);
      dst += got;
      offset += static_cast<uint64_t>(got);
      size -= static_cast<size_t>(got);
    }
  }

  template <typename T>
  std::vector<T> read_array(uint64_t offset, size_t count) const {
    std::vector<T> out(count);
    read_at(offset, out.data(), count * sizeof(T));
    return out;
  }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

ElfSymbols read_elf_symbols(const std::string &path, const std::unordered_set<std::string> &wanted) {
  File file(path);
  Elf64_Ehdr header;
  file.read_at(0, &header, sizeof(header));
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64)
    throw std::runtime_error(path + " is not an ELF64 file");
  if (header.e_shentsize != sizeof(Elf64_Shdr))
    throw std::runtime_error(path + " has an unexpected section header size");

  auto sections = file.read_array<Elf64_Shdr>(header.e_shoff, header.e_shnum);
  const Elf64_Shdr *symtab = nullptr;
  for (const auto &section : sections)
    if (section.sh_type == SHT_SYMTAB) symtab = &section;
  if (symtab == nullptr || symtab->sh_link >= sections.size())
    throw std::runtime_error(path + " has no .symtab (the library is stripped)");

  const Elf64_Shdr &strtab_section = sections[symtab->sh_link];
  auto strtab = file.read_array<char>(strtab_section.sh_offset, strtab_section.sh_size);
  auto symbols = file.read_array<Elf64_Sym>(symtab->sh_offset, symtab->sh_size / sizeof(Elf64_Sym));

  ElfSymbols out;
  for (const auto &symbol : symbols) {
    if (symbol.st_name == 0 || symbol.st_value == 0 || symbol.st_name >= strtab.size()) continue;
    const char *name = strtab.data() + symbol.st_name;
    if (std::strncmp(name, "_ZTV", 4) == 0) {
      out.vtables.emplace(symbol.st_value, name);
    } else if (wanted.count(name)) {
      out.named.emplace(name, ElfSymbol{symbol.st_value, symbol.st_size});
    }
  }
  return out;
}

}  // namespace tritonpatch

#include "elf_symbols.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

namespace tritonpatch {
namespace {

class File {
 public:
  File(const std::string &path, const std::string &label)
      : label_(label), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw std::runtime_error("cannot open " + label + ": " + std::strerror(errno));
  }
  ~File() { ::close(fd_); }
  File(const File &) = delete;
  File &operator=(const File &) = delete;

  void read_at(uint64_t offset, void *out, size_t size) const {
    auto *dst = static_cast<char *>(out);
    while (size > 0) {
      ssize_t got = ::pread(fd_, dst, size, static_cast<off_t>(offset));
      if (got <= 0) throw std::runtime_error("short read from " + label_);
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
  std::string label_;
  int fd_;
};

}  // namespace

std::string find_build_id(const char *notes, size_t size) {
  auto aligned = [](size_t n) { return (n + 3) & ~size_t(3); };
  size_t at = 0;
  while (at + sizeof(Elf64_Nhdr) <= size) {
    Elf64_Nhdr note;
    std::memcpy(&note, notes + at, sizeof(note));
    size_t name_at = at + sizeof(note);
    size_t desc_at = name_at + aligned(note.n_namesz);
    size_t next = desc_at + aligned(note.n_descsz);
    if (next > size || next <= at) break;
    if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(notes + name_at, "GNU", 4) == 0)
      return std::string(notes + desc_at, note.n_descsz);
    at = next;
  }
  return {};
}

ElfSymbols read_elf_symbols(const std::string &path, const std::string &label,
                            const std::unordered_set<std::string> &wanted) {
  File file(path, label);
  Elf64_Ehdr header;
  file.read_at(0, &header, sizeof(header));
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64)
    throw std::runtime_error(label + " is not an ELF64 file");
  if (header.e_shentsize != sizeof(Elf64_Shdr))
    throw std::runtime_error(label + " has an unexpected section header size");

  auto sections = file.read_array<Elf64_Shdr>(header.e_shoff, header.e_shnum);
  const Elf64_Shdr *symtab = nullptr;
  for (const auto &section : sections)
    if (section.sh_type == SHT_SYMTAB) symtab = &section;
  if (symtab == nullptr || symtab->sh_link >= sections.size())
    throw std::runtime_error(label + " has no .symtab (the library is stripped)");

  const Elf64_Shdr &strtab_section = sections[symtab->sh_link];
  auto strtab = file.read_array<char>(strtab_section.sh_offset, strtab_section.sh_size);
  auto symbols = file.read_array<Elf64_Sym>(symtab->sh_offset, symtab->sh_size / sizeof(Elf64_Sym));

  ElfSymbols out;
  for (const auto &section : sections) {
    if (section.sh_type != SHT_NOTE || !out.build_id.empty()) continue;
    auto notes = file.read_array<char>(section.sh_offset, section.sh_size);
    out.build_id = find_build_id(notes.data(), notes.size());
  }
  for (const auto &symbol : symbols) {
    if (symbol.st_name == 0 || symbol.st_value == 0 || symbol.st_name >= strtab.size()) continue;
    if (ELF64_ST_TYPE(symbol.st_info) == STT_OBJECT && symbol.st_size > 0)
      out.object_sizes.emplace(symbol.st_value, symbol.st_size);
    const char *name = strtab.data() + symbol.st_name;
    if (std::strncmp(name, "_ZTV", 4) == 0) {
      out.vtables.emplace(symbol.st_value, name);
    } else if (wanted.count(name)) {
      out.named.emplace(name, ElfSymbol{symbol.st_value, symbol.st_size});
    }
  }
  return out;
}

namespace {

// What the loader knows about the library mapped at `load_bias`: its build ID (read from the
// PT_NOTE segment in memory) and the address of its offset-0 segment.
struct Image {
  uintptr_t load_bias = 0;
  std::string build_id;
  uintptr_t first_segment = 0;
  bool found = false;
};

int visit_image(dl_phdr_info *info, size_t, void *data) {
  auto *image = static_cast<Image *>(data);
  if (info->dlpi_addr != image->load_bias) return 0;
  image->found = true;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) &segment = info->dlpi_phdr[i];
    const char *start = reinterpret_cast<const char *>(info->dlpi_addr + segment.p_vaddr);
    if (segment.p_type == PT_NOTE && image->build_id.empty())
      image->build_id = find_build_id(start, segment.p_memsz);
    if (segment.p_type == PT_LOAD && segment.p_offset == 0)
      image->first_segment = info->dlpi_addr + segment.p_vaddr;
  }
  return 1;
}

// The /proc/self/maps line of the mapping that holds `address`.
struct Mapping {
  std::string range;  // "start-end" as /proc/self/map_files names it
  dev_t device = 0;
  ino_t inode = 0;
};

Mapping mapping_of(uintptr_t address) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t start = 0, end = 0;
    unsigned major = 0, minor = 0;
    unsigned long long offset = 0, inode = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %*s %llx %x:%x %llu", &start, &end, &offset, &major,
                    &minor, &inode) != 6)
      continue;
    if (start <= address && address < end)
      return {line.substr(0, line.find(' ')), makedev(major, minor), static_cast<ino_t>(inode)};
  }
  throw std::runtime_error("the mapping of the loaded library is not in /proc/self/maps");
}

std::string replaced_message(const std::string &path) {
  return path + " is no longer the file loaded in this process (it was replaced on disk after it was "
                "loaded, e.g. by `pip install -U triton` while Python was running); restart the Python "
                "process to use LLVM options";
}

}  // namespace

LoadedLibrary find_loaded_library(const std::string &path) {
  void *handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr)
    throw std::runtime_error(path + " is not loaded in this process (import triton._C.libtriton first)");
  link_map *map = nullptr;
  int status = dlinfo(handle, RTLD_DI_LINKMAP, &map);
  dlclose(handle);  // drops the reference RTLD_NOLOAD added; the library stays loaded
  if (status != 0 || map == nullptr) throw std::runtime_error("dlinfo failed on " + path);

  LoadedLibrary lib;
  lib.path = (map->l_name != nullptr && map->l_name[0] != '\0') ? map->l_name : path;
  lib.load_bias = map->l_addr;
  Image image;
  image.load_bias = map->l_addr;
  dl_iterate_phdr(visit_image, &image);
  if (!image.found || image.first_segment == 0)
    throw std::runtime_error("the loader lists no segments for " + lib.path);
  lib.build_id = image.build_id;

  // Read the mapped file itself; where /proc/self/map_files is not available, the path, provided
  // it still holds the mapped file (checked here by device and inode, and later by build ID).
  Mapping mapping = mapping_of(image.first_segment);
  std::string mapped = "/proc/self/map_files/" + mapping.range;
  int fd = ::open(mapped.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    lib.elf_path = mapped;
    return lib;
  }
  struct stat now {};
  if (lib.build_id.empty() &&
      (::stat(lib.path.c_str(), &now) != 0 || now.st_dev != mapping.device || now.st_ino != mapping.inode))
    throw std::runtime_error(replaced_message(lib.path));
  lib.elf_path = lib.path;
  return lib;
}

void check_file_is_loaded_image(const LoadedLibrary &lib, const std::string &file_build_id) {
  if (file_build_id != lib.build_id) throw std::runtime_error(replaced_message(lib.path));
}

}  // namespace tritonpatch

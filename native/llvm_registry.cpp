#include "llvm_registry.h"

#include <dlfcn.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include "elf_symbols.h"

namespace tritonpatch {
namespace {

// Symbols resolved from libtriton.so's .symtab (LOCAL in 3.6, also exported from 3.7 on).
constexpr const char *kParseSymbol = "LLVMParseCommandLineOptions";
constexpr const char *kRegisteredOptionsSymbol = "_ZN4llvm2cl20getRegisteredOptionsERNS0_10SubCommandE";
constexpr const char *kTopLevelSymbol = "_ZN4llvm2cl10SubCommand11getTopLevelEv";
constexpr const char *kResetSymbol = "_ZN4llvm2cl6Option5resetEv";

// llvm::cl::Option fields that the registry walk validates for every entry: the vtable pointer
// at +0 and ArgStr (a StringRef) at +16 must equal the registry key. HelpStr follows ArgStr.
// The 8 bytes between them hold the occurrence count, flag bits and position.
constexpr size_t kBookkeepingOffset = 8;
constexpr size_t kArgStrOffset = 16;
constexpr size_t kHelpStrOffset = 32;
constexpr size_t kVtableAddressPoint = 16;  // vptr = &_ZTV... + 16 (offset-to-top, typeinfo)
constexpr size_t kCalibrationWindow = 256;
// libstdc++'s std::function: {_Any_data functor (16 bytes); manager; invoker}. It is the last
// member of cl::opt (Callback), so it fills the last 32 bytes of the option object.
constexpr size_t kStdFunctionSize = 32;
constexpr size_t kMaxName = 4096;
constexpr size_t kMaxString = 1 << 20;

// Copies memory of this process without faulting on a bad address: process_vm_readv on our own
// pid, or, where that system call is refused, a pipe write (which fails with EFAULT instead).
bool read_memory(uintptr_t address, void *out, size_t size) {
  if (address == 0 || size == 0) return size == 0;
  iovec local{out, size};
  iovec remote{reinterpret_cast<void *>(address), size};
  ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  if (got == static_cast<ssize_t>(size)) return true;
  if (got >= 0 || (errno != ENOSYS && errno != EPERM)) return false;
  int fds[2];
  if (pipe(fds) != 0) return false;
  bool ok = size <= 65536 && write(fds[1], remote.iov_base, size) == static_cast<ssize_t>(size) &&
            read(fds[0], out, size) == static_cast<ssize_t>(size);
  close(fds[0]);
  close(fds[1]);
  return ok;
}

template <typename T>
std::optional<T> load(uintptr_t address) {
  T value;
  if (!read_memory(address, &value, sizeof(T))) return std::nullopt;
  return value;
}

std::optional<std::vector<uint8_t>> load_bytes(uintptr_t address, size_t size) {
  std::vector<uint8_t> out(size);
  if (!read_memory(address, out.data(), size)) return std::nullopt;
  return out;
}

// A StringRef {const char *data; size_t size} at `address`.
std::optional<std::string> load_string_ref(uintptr_t address, size_t max_size = kMaxName) {
  auto data = load<uint64_t>(address);
  auto size = load<uint64_t>(address + 8);
  if (!data || !size || *size > max_size) return std::nullopt;
  std::string out(*size, '\0');
  if (*size && !read_memory(*data, out.data(), *size)) return std::nullopt;
  return out;
}

// A libstdc++ std::string {char *data; size_t size; ...}: the data must be NUL-terminated.
std::optional<std::string> load_std_string(uintptr_t address) {
  auto text = load_string_ref(address, kMaxString);
  if (!text) return std::nullopt;
  auto data = load<uint64_t>(address);
  auto terminator = load<char>(*data + text->size());
  if (!terminator || *terminator != '\0') return std::nullopt;
  return text;
}

// Whether the machine code at `address` returns at once: `ret` or `rep ret`, after an optional
// `endbr64`. That is the invoker of cl::opt's default callback, an empty lambda.
bool returns_at_once(uintptr_t address) {
  auto code = load<std::array<uint8_t, 6>>(address);
  if (!code) return false;
  size_t at = 0;
  const uint8_t endbr64[] = {0xf3, 0x0f, 0x1e, 0xfa};
  if (std::memcmp(code->data(), endbr64, 4) == 0) at = 4;
  return (*code)[at] == 0xc3 || ((*code)[at] == 0xf3 && (*code)[at + 1] == 0xc3);
}

bool is_power_of_two(uint32_t n) { return n != 0 && (n & (n - 1)) == 0; }

bool starts_with(const std::string &s, const char *prefix) { return s.rfind(prefix, 0) == 0; }

// Itanium mangling of the scalar template arguments of cl::opt<T, External, parser<T>>.
struct ScalarCode {
  const char *mangled;
  Kind kind;
  int width;
};
constexpr ScalarCode kScalarCodes[] = {
    {"b", Kind::Bool, 1},      {"i", Kind::Int, 4},       {"j", Kind::Unsigned, 4},
    {"l", Kind::Long, 8},      {"m", Kind::ULong, 8},     {"x", Kind::LongLong, 8},
    {"y", Kind::ULongLong, 8}, {"f", Kind::Float, 4},     {"d", Kind::Double, 8},
    {"NS0_13boolOrDefaultE", Kind::BoolOrDefault, 4},
    {"NSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE", Kind::String, 0},
};

struct Classified {
  Kind kind = Kind::Other;
  bool external = false;
  int width = 0;
};

// Reads the option type from its vtable symbol, e.g. _ZTVN4llvm2cl3optIjLb0ENS0_6parserIjEEEE
// is cl::opt<unsigned, false, parser<unsigned>>.
Classified classify_vtable(const std::string &name) {
  if (starts_with(name, "_ZTVN4llvm2cl4listI")) return {Kind::List, false, 0};
  if (starts_with(name, "_ZTVN4llvm2cl4bitsI")) return {Kind::Bits, false, 0};
  const std::string prefix = "_ZTVN4llvm2cl3optI";
  if (!starts_with(name, prefix.c_str())) return {};
  std::string rest = name.substr(prefix.size());
  size_t flag = rest.find("Lb0E");
  size_t flag_external = rest.find("Lb1E");
  bool external = flag_external != std::string::npos && (flag == std::string::npos || flag_external < flag);
  size_t at = external ? flag_external : flag;
  if (at == std::string::npos) return {};
  std::string type = rest.substr(0, at);
  std::string parser = rest.substr(at + 4);
  if (!starts_with(parser, "NS0_6parserI")) return {};  // a custom parser: listed, not typed
  for (const auto &code : kScalarCodes)
    if (type == code.mangled) return {code.kind, external, code.width};
  // parser<E> of the option's own non-builtin type (a back-reference "S<n>_" in the mangling):
  // an enum declared with cl::values(...). Other class types with a builtin parser are listed only.
  if (starts_with(parser, "NS0_6parserIS")) return {Kind::Enum, external, 0};
  return {};
}

}  // namespace

const char *callback_name(Callback callback) {
  switch (callback) {
    case Callback::None: return "none";
    case Callback::Custom: return "custom";
    case Callback::Unknown: return "unknown";
  }
  return "unknown";
}

const char *kind_name(Kind kind) {
  switch (kind) {
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Unsigned: return "unsigned";
    case Kind::Long: return "long";
    case Kind::ULong: return "unsigned long";
    case Kind::LongLong: return "long long";
    case Kind::ULongLong: return "unsigned long long";
    case Kind::Float: return "float";
    case Kind::Double: return "double";
    case Kind::String: return "string";
    case Kind::BoolOrDefault: return "boolOrDefault";
    case Kind::Enum: return "enum";
    case Kind::List: return "list";
    case Kind::Bits: return "bits";
    case Kind::Other: return "other";
  }
  return "other";
}

Registry::Registry(const std::string &libtriton_path) : path_(libtriton_path) {
  std::lock_guard<std::mutex> guard(mutex_);
  LoadedLibrary lib = find_loaded_library(libtriton_path);
  path_ = lib.path;
  symbols_from_ = lib.elf_path;
  load_bias_ = lib.load_bias;

  const char *const wanted[] = {kParseSymbol, kRegisteredOptionsSymbol, kTopLevelSymbol, kResetSymbol};
  ElfSymbols symbols = read_elf_symbols(lib.elf_path, path_, {std::begin(wanted), std::end(wanted)});
  check_file_is_loaded_image(lib, symbols.build_id);
  for (const char *name : wanted)
    if (!symbols.named.count(name))
      throw std::runtime_error(std::string("symbol ") + name + " is not in " + path_ + "'s .symtab");
  for (const auto &[value, name] : symbols.vtables) vtables_.emplace(load_bias_ + value, name);

  auto address_of = [&](const char *name) { return load_bias_ + symbols.named.at(name).value; };
  // Cross-check the load bias: the loader must attribute the resolved address to libtriton.
  if (!in_library(address_of(kParseSymbol)))
    throw std::runtime_error("the load address of " + path_ + " could not be confirmed with dladdr");

  parse_fn_ = reinterpret_cast<void (*)(int, const char *const *, const char *)>(address_of(kParseSymbol));
  reset_fn_ = reinterpret_cast<void (*)(void *)>(address_of(kResetSymbol));
  auto top_level = reinterpret_cast<void *(*)()>(address_of(kTopLevelSymbol));
  auto registered = reinterpret_cast<void *(*)(void *)>(address_of(kRegisteredOptionsSymbol));
  auto registry = reinterpret_cast<uintptr_t>(registered(top_level()));

  // Probe every container layout Triton 3.6-3.9 ship; keep the first that validates completely.
  std::optional<RegistryEntries> found;
  std::string reasons;
  const char *dense_layouts[] = {"DenseMap+tombstones", "DenseMap", "DenseMap+used-bitmap"};
  for (int layout = -1; layout < 3 && !found; ++layout) {
    const char *layout_name = layout < 0 ? "StringMap" : dense_layouts[layout];
    std::string why;
    auto walked = layout < 0 ? walk_string_map(registry, &why) : walk_dense_map(registry, layout, &why);
    if (walked && validate(*walked, &why)) {
      found = std::move(walked);
      layout_ = layout_name;
    } else {
      reasons += std::string("\n  ") + layout_name + ": " + why;
    }
  }
  if (!found)
    throw std::runtime_error("the LLVM option registry has an unrecognised layout; refusing to guess:" + reasons);
  registry_entries_ = found->size();
  for (const auto &[key, address] : *found) {
    auto arg = load_string_ref(address + kArgStrOffset);
    if (arg && *arg == key) {  // entries registered under a value name (enum flags) are not options
      by_name_.emplace(key, entries_.size());
      entries_.push_back(Entry{key, address, Kind::Other, false, 0, {}, false, Callback::Unknown});
    }
  }
  classify_all();
  calibrate();
  find_callbacks(symbols.object_sizes);
}

std::optional<Registry::RegistryEntries> Registry::walk_string_map(uintptr_t map, std::string *why) {
  // StringMapImpl {StringMapEntryBase **TheTable; u32 NumBuckets, NumItems, NumTombstones, ItemSize}
  auto table = load<uint64_t>(map);
  auto counts = load<std::array<uint32_t, 4>>(map + 8);
  if (!table || !counts) return *why = "header unreadable", std::nullopt;
  auto [buckets, items, tombstones, item_size] = *counts;
  if (!is_power_of_two(buckets) || buckets > (1u << 22) || items > buckets || tombstones > buckets || item_size != 16)
    return *why = "header implausible", std::nullopt;
  auto slots = load_bytes(*table, size_t(buckets) * 8);
  if (!slots) return *why = "bucket array unreadable", std::nullopt;
  RegistryEntries out;
  for (uint32_t i = 0; i < buckets; ++i) {
    uint64_t entry;
    std::memcpy(&entry, slots->data() + size_t(i) * 8, 8);
    if (entry == 0 || entry == uint64_t(-8)) continue;  // empty / tombstone
    auto key_size = load<uint64_t>(entry);
    auto option = load<uint64_t>(entry + 8);
    if (!key_size || !option || *key_size > kMaxName) return *why = "entry unreadable", std::nullopt;
    std::string key(*key_size, '\0');
    if (!read_memory(entry + 16, key.data(), key.size())) return *why = "key unreadable", std::nullopt;
    out.emplace_back(std::move(key), *option);
  }
  if (out.size() != items) return *why = "walk found " + std::to_string(out.size()) + " of " + std::to_string(items), std::nullopt;
  return out;
}

std::optional<Registry::RegistryEntries> Registry::walk_dense_map(uintptr_t map, int layout, std::string *why) {
  // DenseMap<StringRef, Option*> after a DebugEpochBase word; buckets are {data, size, Option*}.
  //  0: {epoch; Bucket *; u32 NumEntries, NumTombstones, NumBuckets}   (Triton 3.7)
  //  1: {epoch; Bucket *; u32 NumEntries, NumBuckets}                  (Triton 3.8)
  //  2: {epoch; Bucket *; u32 *Used; u32 NumEntries, NumBuckets}       (Triton 3.9)
  auto buckets_ptr = load<uint64_t>(map + 8);
  uint64_t used_ptr = 0;
  std::optional<uint32_t> entries, buckets;
  if (layout == 0) entries = load<uint32_t>(map + 16), buckets = load<uint32_t>(map + 24);
  if (layout == 1) entries = load<uint32_t>(map + 16), buckets = load<uint32_t>(map + 20);
  if (layout == 2) {
    auto used = load<uint64_t>(map + 16);
    if (!used) return *why = "header unreadable", std::nullopt;
    used_ptr = *used;
    entries = load<uint32_t>(map + 24), buckets = load<uint32_t>(map + 28);
  }
  if (!buckets_ptr || !entries || !buckets) return *why = "header unreadable", std::nullopt;
  if (!is_power_of_two(*buckets) || *buckets > (1u << 22) || *entries > *buckets)
    return *why = "header implausible", std::nullopt;
  auto raw = load_bytes(*buckets_ptr, size_t(*buckets) * 24);
  if (!raw) return *why = "bucket array unreadable", std::nullopt;
  std::optional<std::vector<uint8_t>> used;
  if (layout == 2 && !(used = load_bytes(used_ptr, size_t((*buckets + 31) / 32) * 4)))
    return *why = "occupancy bitmap unreadable", std::nullopt;
  RegistryEntries out;
  for (uint32_t i = 0; i < *buckets; ++i) {
    uint64_t bucket[3];
    std::memcpy(bucket, raw->data() + size_t(i) * 24, 24);
    bool live = layout == 2 ? ((*used)[i / 8] >> (i % 8)) & 1 : bucket[0] != ~0ull && bucket[0] != ~1ull;
    if (!live) continue;
    if (bucket[1] > kMaxName) return *why = "key implausible", std::nullopt;
    std::string key(bucket[1], '\0');
    if (!read_memory(bucket[0], key.data(), key.size())) return *why = "key unreadable", std::nullopt;
    out.emplace_back(std::move(key), bucket[2]);
  }
  if (out.size() != *entries) return *why = "walk found " + std::to_string(out.size()) + " of " + std::to_string(*entries), std::nullopt;
  return out;
}

bool Registry::validate(const RegistryEntries &raw, std::string *why) {
  size_t named = 0;
  for (const auto &[key, address] : raw) {
    auto vptr = load<uint64_t>(address);
    if (!vptr || vtable_name(*vptr).empty())
      return *why = "option '" + key + "' has no vtable pointer", false;
    auto arg = load_string_ref(address + kArgStrOffset);
    if (!arg) return *why = "option '" + key + "' has an unreadable name", false;
    if (*arg == key) ++named;
    else if (!arg->empty()) return *why = "option name '" + *arg + "' differs from key '" + key + "'", false;
  }
  if (raw.size() < 100 || named * 10 < raw.size() * 9)
    return *why = "too few entries carry their own name", false;
  return true;
}

bool Registry::in_library(uintptr_t address) const {
  Dl_info where{};
  return dladdr(reinterpret_cast<void *>(address), &where) && where.dli_fname != nullptr && path_ == where.dli_fname;
}

std::string Registry::vtable_name(uint64_t vptr) const {
  auto it = vtables_.find(vptr - kVtableAddressPoint);
  return it == vtables_.end() ? std::string() : it->second;
}

bool Registry::is_option_value_vtable(uint64_t vptr) const {
  std::string name = vtable_name(vptr);
  return starts_with(name, "_ZTVN4llvm2cl11OptionValueI") || starts_with(name, "_ZTVN4llvm2cl15OptionValueCopyI");
}

void Registry::classify_all() {
  for (auto &e : entries_) {
    Classified c = classify_vtable(vtable_name(*load<uint64_t>(e.address)));
    e.kind = c.kind;
    e.external = c.external;
    e.width = c.width;
  }
}

void Registry::calibrate() {
  // Find the value slot and the occurrence counter by flipping a plain opt<bool> through LLVM's
  // parser and watching which bytes follow, then put every byte back.
  const Entry *probe = nullptr;
  auto candidate = by_name_.find("disable-lsr");
  if (candidate != by_name_.end() && entries_[candidate->second].kind == Kind::Bool && !entries_[candidate->second].external)
    probe = &entries_[candidate->second];
  for (size_t i = 0; probe == nullptr && i < entries_.size(); ++i)
    if (entries_[i].kind == Kind::Bool && !entries_[i].external) probe = &entries_[i];
  if (probe == nullptr) throw std::runtime_error("no opt<bool> found to calibrate with");

  auto before = load_bytes(probe->address, kCalibrationWindow);
  if (!before) throw std::runtime_error("calibration option unreadable");
  std::vector<std::vector<uint8_t>> seen;
  for (const char *text : {"=true", "=false", "=true"}) {
    parse_argument("-" + probe->name + text);
    seen.push_back(*load_bytes(probe->address, kCalibrationWindow));
  }
  std::vector<size_t> value_offsets, occurrence_offsets;
  for (size_t at = kHelpStrOffset; at < kCalibrationWindow; ++at)
    if (seen[0][at] == 1 && seen[1][at] == 0 && seen[2][at] == 1) value_offsets.push_back(at);
  for (size_t at = kBookkeepingOffset; at < kArgStrOffset; at += 2) {
    auto count = [&](const std::vector<uint8_t> &bytes) { return uint16_t(bytes[at] | bytes[at + 1] << 8); };
    if (count(seen[0]) == count(*before) + 1 && count(seen[1]) == count(*before) + 2 && count(seen[2]) == count(*before) + 3)
      occurrence_offsets.push_back(at);
  }
  // Restore the probe: reset() zeroes the count and restores the default, then the exact bytes.
  reset_fn_(reinterpret_cast<void *>(probe->address));
  std::memcpy(reinterpret_cast<void *>(probe->address + kBookkeepingOffset), before->data() + kBookkeepingOffset, 8);
  if (value_offsets.size() == 1)
    std::memcpy(reinterpret_cast<void *>(probe->address + value_offsets[0]), before->data() + value_offsets[0], 1);
  if (*load_bytes(probe->address, kCalibrationWindow) != *before)
    throw std::runtime_error("calibration could not restore option '" + probe->name + "'");
  if (value_offsets.size() != 1 || occurrence_offsets.size() != 1)
    throw std::runtime_error("calibration found no unique value slot in option '" + probe->name + "'");
  value_offset_ = value_offsets[0];
  occurrences_offset_ = occurrence_offsets[0];
  calibrated_with_ = {probe->name};

  // Every other scalar must have an OptionValue (its default) right after the slot; options whose
  // layout does not match are listed with unreadable values and cannot be set.
  for (auto &e : entries_) {
    if (e.kind == Kind::Enum) read_enum_choices(e);
    if (e.kind != Kind::String && e.kind != Kind::List && e.kind != Kind::Bits && e.kind != Kind::Other) {
      auto vptr = load<uint64_t>(e.address + value_offset_ + 8);
      if (!vptr || !is_option_value_vtable(*vptr)) e.width = 0;
    }
  }

  // Cross-check the slot with an unsigned option: a written number must appear there alone.
  auto unsigned_probe = by_name_.find("unroll-threshold");
  if (unsigned_probe != by_name_.end() && entries_[unsigned_probe->second].kind == Kind::Unsigned) {
    const Entry &e = entries_[unsigned_probe->second];
    OptionState saved = capture(e);
    parse_argument("-" + e.name + "=12345");
    auto bytes = *load_bytes(e.address, kCalibrationWindow);
    restore_unlocked(saved);
    std::vector<size_t> hits;
    for (size_t at = kHelpStrOffset; at + 4 <= kCalibrationWindow; at += 4) {
      uint32_t v;
      std::memcpy(&v, bytes.data() + at, 4);
      if (v == 12345) hits.push_back(at);
    }
    if (hits.size() != 1 || hits[0] != value_offset_)
      throw std::runtime_error("calibration with 'unroll-threshold' disagrees with '" + probe->name + "'");
    calibrated_with_.push_back(e.name);
  }
}

void Registry::find_callbacks(const std::unordered_map<uint64_t, uint64_t> &object_sizes) {
  // sizeof of each option class (one vtable per class): the size most of its options that are
  // symbols of their own have. An option inside a larger object (or first in one, whose symbol
  // gives the larger size) has its callback at the same offset as the others of its class.
  std::map<uint64_t, std::map<uint64_t, size_t>> sizes_seen;  // vptr -> size -> how many
  for (const auto &e : entries_) {
    auto size = object_sizes.find(e.address - load_bias_);
    if (size != object_sizes.end()) ++sizes_seen[*load<uint64_t>(e.address)][size->second];
  }
  std::map<uint64_t, uint64_t> class_size;
  for (const auto &[vptr, counts] : sizes_seen) {
    auto most = counts.begin();
    for (auto it = counts.begin(); it != counts.end(); ++it)
      if (it->second > most->second) most = it;
    class_size[vptr] = most->first;
  }
  for (auto &e : entries_) {
    auto size = class_size.find(*load<uint64_t>(e.address));
    e.callback = size == class_size.end() ? Callback::Unknown : read_callback(e.address, size->second);
  }
  // The calibration options are plain cl::opts without a callback: if they do not read so, this
  // LLVM's layout is not the one expected and no option counts as callback-free.
  for (const auto &name : calibrated_with_)
    if (entries_[by_name_.at(name)].callback != Callback::None) {
      for (auto &e : entries_) e.callback = Callback::Unknown;
      return;
    }
}

Callback Registry::read_callback(uintptr_t option, uint64_t size) const {
  if (size < kHelpStrOffset + kStdFunctionSize) return Callback::Unknown;
  auto function = load<std::array<uint64_t, 4>>(option + size - kStdFunctionSize);
  if (!function) return Callback::Unknown;
  uint64_t manager = (*function)[2], invoker = (*function)[3];
  if (manager == 0) return Callback::None;  // an empty std::function: nothing is called
  if (!in_library(manager) || !in_library(invoker)) return Callback::Unknown;
  return returns_at_once(invoker) ? Callback::None : Callback::Custom;
}

void Registry::read_enum_choices(Entry &e) {
  // parser<E> follows the default OptionValue: {vptr; Option &Owner; SmallVector<OptionInfo> Values}
  // with OptionInfo {StringRef Name; StringRef Help; OptionValue<E> V {vptr; E Value; bool Valid}}.
  uintptr_t parser = 0;
  for (size_t at = value_offset_ + 8; at < value_offset_ + 80 && !parser; at += 8) {
    auto vptr = load<uint64_t>(e.address + at);
    auto owner = load<uint64_t>(e.address + at + 8);
    if (vptr && owner && *owner == e.address && starts_with(vtable_name(*vptr), "_ZTVN4llvm2cl6parserI"))
      parser = e.address + at;
  }
  if (!parser) return;
  auto begin = load<uint64_t>(parser + 16);
  auto size = load<uint32_t>(parser + 24);
  auto capacity = load<uint32_t>(parser + 28);
  if (!begin || !size || !capacity || *size == 0 || *size > *capacity || *capacity > 4096) return;
  std::vector<int> widths;
  for (int width : {1, 2, 4, 8}) {
    size_t stride = 32 + ((8 + width + 1 + 7) / 8) * 8;
    auto first_vptr = load<uint64_t>(*begin + 32);
    bool ok = first_vptr && is_option_value_vtable(*first_vptr);
    for (uint32_t i = 0; ok && i < *size; ++i) {
      uintptr_t info = *begin + i * stride;
      auto vptr = load<uint64_t>(info + 32);
      auto valid = load<uint8_t>(info + 40 + width);
      ok = vptr && *vptr == *first_vptr && valid && *valid == 1 && load_string_ref(info).has_value();
    }
    if (ok) widths.push_back(width);
  }
  if (widths.size() != 1) return;  // ambiguous or unrecognised: fail closed
  int width = widths[0];
  size_t stride = 32 + ((8 + width + 1 + 7) / 8) * 8;
  std::vector<Choice> choices;
  for (uint32_t i = 0; i < *size; ++i) {
    uintptr_t info = *begin + i * stride;
    int64_t value = 0;
    if (!read_memory(info + 40, &value, width)) return;
    choices.push_back({*load_string_ref(info), value});
  }
  e.width = width;
  e.choices = std::move(choices);
  e.choices_readable = true;
}

const Registry::Entry &Registry::entry(const std::string &name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw std::out_of_range("unknown LLVM option '" + name + "'");
  return entries_[it->second];
}

bool Registry::settable(const Entry &e) const {
  switch (e.kind) {
    case Kind::String: return true;
    case Kind::Enum: return e.choices_readable && e.width > 0;
    case Kind::List: case Kind::Bits: case Kind::Other: return false;
    default: return e.width > 0;
  }
}

uintptr_t Registry::value_slot(const Entry &e) const {
  if (!e.external) return e.address + value_offset_;
  auto pointer = load<uint64_t>(e.address + value_offset_);
  return pointer ? *pointer : 0;
}

Value Registry::read_value(const Entry &e, uintptr_t slot) const {
  if (slot == 0) return {};
  if (e.kind == Kind::String) {
    auto text = load_std_string(slot);
    return text ? Value(*text) : Value();
  }
  if (e.width == 0) return {};
  uint64_t bits = 0;
  if (!read_memory(slot, &bits, e.width)) return {};
  switch (e.kind) {
    case Kind::Bool: return Value(bool(bits & 0xff));
    case Kind::Int: return Value(int64_t(int32_t(uint32_t(bits))));
    case Kind::Unsigned: case Kind::ULong: case Kind::ULongLong: return Value(bits);
    case Kind::Long: case Kind::LongLong: return Value(int64_t(bits));
    case Kind::Float: { float f; uint32_t b = uint32_t(bits); std::memcpy(&f, &b, 4); return Value(double(f)); }
    case Kind::Double: { double d; std::memcpy(&d, &bits, 8); return Value(d); }
    case Kind::BoolOrDefault:
      if (bits == 1) return Value(true);
      if (bits == 2) return Value(false);
      return {};
    case Kind::Enum:
      for (const auto &choice : e.choices)
        if (uint64_t(choice.value) == bits) return Value(choice.name);
      return {};
    default: return {};
  }
}

Value Registry::read_default(const Entry &e) const {
  // OptionValue<T> Default sits right after the slot (the slot is 8 bytes, or 32 for a string
  // held in place): {vptr; T Value; bool Valid}.
  size_t slot_size = (e.kind == Kind::String && !e.external) ? 32 : 8;
  uintptr_t option_value = e.address + value_offset_ + slot_size;
  auto vptr = load<uint64_t>(option_value);
  if (!vptr || !is_option_value_vtable(*vptr)) return {};
  size_t value_size = e.kind == Kind::String ? 32 : size_t(e.width);
  if (value_size == 0) return {};
  auto valid = load<uint8_t>(option_value + 8 + value_size);
  if (!valid || *valid != 1) return {};
  Entry in_place = e;
  in_place.external = false;
  return read_value(in_place, option_value + 8);
}

unsigned Registry::read_occurrences(const Entry &e) const {
  return load<uint16_t>(e.address + occurrences_offset_).value_or(0);
}

OptionView Registry::view(const Entry &e) const {
  OptionView v{e.name, e.kind, e.external, read_value(e, value_slot(e)), read_default(e), read_occurrences(e),
               load_string_ref(e.address + kHelpStrOffset, kMaxString).value_or(""), std::nullopt, {}, e.callback};
  if (e.choices_readable) {
    std::vector<std::string> names;
    for (const auto &c : e.choices) {
      names.push_back(c.name);
      v.choice_values.push_back(c.value);
    }
    v.choices = std::move(names);
  }
  return v;
}

OptionState Registry::capture(const Entry &e) const {
  OptionState s;
  s.name = e.name;
  std::memcpy(s.bookkeeping.data(), reinterpret_cast<const void *>(e.address + kBookkeepingOffset), 8);
  uintptr_t slot = value_slot(e);
  if (e.kind == Kind::String) {
    auto text = load_std_string(slot);
    if (!text) throw std::runtime_error("LLVM option '" + e.name + "' has an unreadable string value");
    s.string_value = *text;
  } else {
    auto bytes = load_bytes(slot, e.width);
    if (!bytes) throw std::runtime_error("LLVM option '" + e.name + "' has an unreadable value");
    s.pod_value = *bytes;
  }
  return s;
}

void Registry::parse_argument(const std::string &argument) {
  const char *argv[] = {"tritonpatch", argument.c_str()};
  parse_fn_(2, argv, "");
}

void Registry::reset_option(const Entry &e) { reset_fn_(reinterpret_cast<void *>(e.address)); }

std::vector<std::string> Registry::names() {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<std::string> out;
  for (const auto &e : entries_) out.push_back(e.name);
  return out;
}

std::vector<OptionView> Registry::options() {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<OptionView> out;
  for (const auto &e : entries_) out.push_back(view(e));
  return out;
}

std::optional<OptionView> Registry::option(const std::string &name) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return view(entries_[it->second]);
}

void Registry::check_settable(const Entry &e) const {
  if (!settable(e))
    throw std::invalid_argument("LLVM option '" + e.name + "' of type " + kind_name(e.kind) + " cannot be set");
  if (e.callback != Callback::None)
    throw std::invalid_argument("LLVM option '" + e.name + "' cannot be set: setting it runs a callback (" +
                                callback_name(e.callback) + ") whose effects cannot be restored");
}

void Registry::parse(const std::string &name, const std::string &text) {
  std::lock_guard<std::mutex> guard(mutex_);
  const Entry &e = entry(name);
  check_settable(e);
  if (text.find('\0') != std::string::npos) throw std::invalid_argument("value contains a NUL character");
  parse_argument("-" + name + "=" + text);
}

void Registry::unset(const std::string &name) {
  std::lock_guard<std::mutex> guard(mutex_);
  const Entry &e = entry(name);
  check_settable(e);
  if (e.kind != Kind::BoolOrDefault) throw std::invalid_argument("LLVM option '" + name + "' is not a boolOrDefault");
  reset_option(e);
  const uint8_t unset_value[4] = {0, 0, 0, 0};  // cl::BOU_UNSET
  std::memcpy(reinterpret_cast<void *>(value_slot(e)), unset_value, e.width);
}

OptionState Registry::snapshot(const std::string &name) {
  std::lock_guard<std::mutex> guard(mutex_);
  const Entry &e = entry(name);
  if (!settable(e)) throw std::invalid_argument("LLVM option '" + name + "' of type " + kind_name(e.kind) + " cannot be saved");
  return capture(e);
}

void Registry::restore(const OptionState &state) {
  std::lock_guard<std::mutex> guard(mutex_);
  restore_unlocked(state);
}

void Registry::restore_unlocked(const OptionState &state) {
  const Entry &e = entry(state.name);
  auto same = [&](const OptionState &now) {
    return now.bookkeeping == state.bookkeeping && now.pod_value == state.pod_value && now.string_value == state.string_value;
  };
  if (same(capture(e))) return;
  uint16_t occurrences;
  std::memcpy(&occurrences, state.bookkeeping.data() + (occurrences_offset_ - kBookkeepingOffset), 2);
  if (occurrences == 0) reset_option(e);  // never specified: LLVM's own reset, one option only
  OptionState now = capture(e);
  if (e.kind == Kind::String) {
    if (now.string_value != state.string_value) {
      // LLVM's parser is the only safe writer of a std::string; it must not run a callback here.
      if (e.callback != Callback::None)
        throw std::runtime_error("LLVM option '" + e.name + "' has a callback; its string value cannot be restored");
      parse_argument("-" + e.name + "=" + state.string_value);
    }
  } else if (now.pod_value != state.pod_value) {
    // A value set without an occurrence (as Triton does for its own flags) is put back byte for byte.
    std::memcpy(reinterpret_cast<void *>(value_slot(e)), state.pod_value.data(), state.pod_value.size());
  }
  std::memcpy(reinterpret_cast<void *>(e.address + kBookkeepingOffset), state.bookkeeping.data(), 8);
  if (!same(capture(e))) throw std::runtime_error("LLVM option '" + e.name + "' could not be restored exactly");
}

std::map<std::string, std::string> Registry::info() {
  std::lock_guard<std::mutex> guard(mutex_);
  std::string calibrated_with;
  for (const auto &name : calibrated_with_) calibrated_with += (calibrated_with.empty() ? "" : ", ") + name;
  char bias[32];
  std::snprintf(bias, sizeof(bias), "0x%llx", static_cast<unsigned long long>(load_bias_));
  return {
      {"libtriton", path_},
      {"load_bias", bias},
      {"registry_layout", layout_},
      {"registry_entries", std::to_string(registry_entries_)},
      {"options", std::to_string(entries_.size())},
      {"value_offset", std::to_string(value_offset_)},
      {"occurrences_offset", std::to_string(occurrences_offset_)},
      {"calibrated_with", calibrated_with},
      {"symbols_from", symbols_from_},
  };
}

}  // namespace tritonpatch

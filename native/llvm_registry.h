// The LLVM command-line option registry inside a loaded libtriton.so, reached without LLVM
// headers: functions and vtables come from the library's .symtab, the registry container is
// probed among the layouts Triton 3.6-3.9 ship and validated entry by entry, and the value slot
// of an option is found by calibration at run time. Anything that does not validate fails closed.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

namespace tritonpatch {

enum class Kind {
  Bool, Int, Unsigned, Long, ULong, LongLong, ULongLong, Float, Double, String, BoolOrDefault,
  Enum, List, Bits, Other
};
const char *kind_name(Kind kind);

// Whether setting an option runs a callback (cl::cb) besides storing the value. A callback can
// change LLVM state outside the option (opt-bisect-limit sets the pass bisector), which no
// restore of the option undoes.
enum class Callback { None, Custom, Unknown };
const char *callback_name(Callback callback);

// None (std::monostate) means "no value", or "cannot be read safely".
using Value = std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string>;

struct OptionView {
  std::string name;
  Kind kind;
  bool external;  // cl::location storage: the value slot holds a pointer
  Value value;
  Value default_value;
  unsigned occurrences;
  std::string help;
  std::optional<std::vector<std::string>> choices;  // enum names, when readable
  std::vector<int64_t> choice_values;               // the value LLVM stores for each name
  Callback callback;
};

// Everything restore() needs to put an option back exactly as it was.
struct OptionState {
  std::string name;
  std::array<uint8_t, 8> bookkeeping;  // occurrence count, flags and position
  std::vector<uint8_t> pod_value;      // raw value bytes (non-string kinds)
  std::string string_value;            // string kinds
};

class Registry {
 public:
  explicit Registry(const std::string &libtriton_path);

  std::vector<std::string> names();
  std::vector<OptionView> options();
  std::optional<OptionView> option(const std::string &name);
  // Runs LLVM's own parser on "-name=text". The caller validates text; set() reads back.
  void parse(const std::string &name, const std::string &text);
  // Puts a boolOrDefault option back to "unset", as never given: LLVM's parser has no word for
  // that, so this is Option::reset() (occurrences 0) and, if its default is not unset, BOU_UNSET.
  void unset(const std::string &name);
  OptionState snapshot(const std::string &name);
  void restore(const OptionState &state);
  std::map<std::string, std::string> info();

 private:
  struct Choice {
    std::string name;
    int64_t value;
  };
  struct Entry {
    std::string name;
    uintptr_t address;
    Kind kind;
    bool external;
    int width;  // bytes of the value for non-string scalar kinds; 0 when unknown
    std::vector<Choice> choices;
    bool choices_readable = false;
    Callback callback = Callback::Unknown;
  };
  using RegistryEntries = std::vector<std::pair<std::string, uintptr_t>>;

  const Entry &entry(const std::string &name) const;
  bool settable(const Entry &e) const;
  void check_settable(const Entry &e) const;
  uintptr_t value_slot(const Entry &e) const;
  Value read_value(const Entry &e, uintptr_t slot) const;
  Value read_default(const Entry &e) const;
  unsigned read_occurrences(const Entry &e) const;
  OptionView view(const Entry &e) const;
  OptionState capture(const Entry &e) const;
  void parse_argument(const std::string &argument);
  void reset_option(const Entry &e);
  void restore_unlocked(const OptionState &state);
  bool in_library(uintptr_t address) const;
  std::string vtable_name(uint64_t vptr) const;
  bool is_option_value_vtable(uint64_t vptr) const;

  std::optional<RegistryEntries> walk_string_map(uintptr_t map, std::string *why);
  std::optional<RegistryEntries> walk_dense_map(uintptr_t map, int layout, std::string *why);
  bool validate(const RegistryEntries &raw, std::string *why);
  void classify_all();
  void read_enum_choices(Entry &e);
  void calibrate();
  void find_callbacks(const std::unordered_map<uint64_t, uint64_t> &object_sizes);
  Callback read_callback(uintptr_t option, uint64_t size) const;

  std::mutex mutex_;
  std::string path_;
  std::string symbols_from_;
  uintptr_t load_bias_ = 0;
  std::map<uint64_t, std::string> vtables_;  // runtime address of the vtable symbol -> name
  void (*parse_fn_)(int, const char *const *, const char *) = nullptr;
  void (*reset_fn_)(void *) = nullptr;
  std::string layout_;
  size_t registry_entries_ = 0;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
  size_t value_offset_ = 0;
  size_t occurrences_offset_ = 0;
  std::vector<std::string> calibrated_with_;
};

}  // namespace tritonpatch

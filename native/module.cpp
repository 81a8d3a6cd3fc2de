// tritonpatch._native: Python bindings of the LLVM option registry found in libtriton.so.
// The typed API, validation and error messages live in tritonpatch/llvm.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "llvm_registry.h"

namespace py = pybind11;
using tritonpatch::OptionState;
using tritonpatch::OptionView;
using tritonpatch::Registry;

namespace {

py::object to_python(const tritonpatch::Value &value) {
  return std::visit(
      [](const auto &v) -> py::object {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::monostate>) return py::none();
        else return py::cast(v);
      },
      value);
}

py::dict to_dict(const OptionView &v) {
  py::dict d;
  d["name"] = v.name;
  d["type"] = tritonpatch::kind_name(v.kind);
  d["external"] = v.external;
  d["value"] = to_python(v.value);
  d["default"] = to_python(v.default_value);
  d["occurrences"] = v.occurrences;
  d["help"] = py::bytes(v.help).attr("decode")("utf-8", "replace");
  d["choices"] = v.choices ? py::cast(*v.choices) : py::none();
  d["choice_values"] = v.choices ? py::cast(v.choice_values) : py::none();
  d["callback"] = tritonpatch::callback_name(v.callback);
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Reach the LLVM cl::opt registry inside Triton's libtriton.so (see tritonpatch.llvm).";

  py::class_<OptionState>(m, "OptionState", "The exact saved state of one LLVM option.")
      .def_property_readonly("name", [](const OptionState &s) { return s.name; })
      .def("__repr__", [](const OptionState &s) { return "<OptionState " + s.name + ">"; });

  py::class_<Registry>(m, "Registry")
      .def(py::init<const std::string &>(), py::arg("libtriton_path"),
           "Open the registry of the libtriton.so at this path (already loaded in the process).")
      .def("names", &Registry::names)
      .def("options", [](Registry &r) {
        py::list out;
        for (const auto &v : r.options()) out.append(to_dict(v));
        return out;
      })
      .def("option", [](Registry &r, const std::string &name) -> py::object {
        auto v = r.option(name);
        return v ? py::object(to_dict(*v)) : py::none();
      })
      .def("parse", &Registry::parse, py::arg("name"), py::arg("text"),
           "Run LLVM's parser on -name=text (validate text first).")
      .def("unset", &Registry::unset, py::arg("name"),
           "Put a boolOrDefault option back to unset (never given, BOU_UNSET).")
      .def("snapshot", &Registry::snapshot, py::arg("name"))
      .def("restore", &Registry::restore, py::arg("state"))
      .def("info", &Registry::info);
}

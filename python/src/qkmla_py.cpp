// qkmla._qkmla: the public C++ API (qkmla/qkmla.hpp) for Python. Arrays cross as (dtype name,
// shape, float64 values): every value of the supported dtypes is a double exactly; the Python
// layer (qkmla/__init__.py) turns them into numpy arrays of the right dtype.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <type_traits>

#include "qkmla/qkmla.hpp"

namespace py = pybind11;
using qkmla::api::Array;

namespace {

Array to_array(const py::tuple& t) {  // (dtype, shape, values)
  Array a;
  a.dtype = t[0].cast<std::string>();
  a.shape = t[1].cast<std::vector<int64_t>>();
  const auto v = t[2].cast<py::array_t<double, py::array::c_style | py::array::forcecast>>();
  a.values.assign(v.data(), v.data() + v.size());
  return a;
}

py::tuple from_array(const Array& a) {
  py::array_t<double> v(py::ssize_t(a.values.size()));
  std::copy(a.values.begin(), a.values.end(), v.mutable_data());
  return py::make_tuple(a.dtype, a.shape, v);
}

std::map<std::string, Array> arrays(const py::dict& d) {
  std::map<std::string, Array> m;
  for (const auto& [k, v] : d) m[k.cast<std::string>()] = to_array(v.cast<py::tuple>());
  return m;
}

// An argument of the wrong type or range (seed=-1, heads="4") is a QkmlaError naming it, not
// pybind11's "Unable to cast Python instance" RuntimeError.
template <class T>
void take(const py::dict& d, const char* key, T& field) {
  if (!d.contains(key) || d[key].is_none()) return;
  try {
    field = d[key].cast<T>();
  } catch (const py::cast_error&) {
    std::string want = "a value of another type";
    if constexpr (std::is_same_v<T, uint64_t>)
      want = "a whole number from 0 to 2^64 - 1";
    else if constexpr (std::is_integral_v<T> || std::is_same_v<T, std::optional<int>>)
      want = "an integer";
    throw std::invalid_argument(std::string(key) + "=" + py::repr(d[key]).cast<std::string>() +
                                ": expected " + want);
  }
}

qkmla::api::CaseOptions case_options(const py::dict& d) {
  qkmla::api::CaseOptions o;
  take(d, "preset", o.preset), take(d, "profile", o.profile), take(d, "level", o.level);
  take(d, "scenario", o.scenario), take(d, "norm", o.norm), take(d, "rope_order", o.rope_order);
  take(d, "rope_style", o.rope_style), take(d, "seqlens", o.seqlens), take(d, "sq", o.sq);
  take(d, "seed", o.seed), take(d, "heads", o.heads), take(d, "groups", o.groups);
  take(d, "latent_rank", o.latent_rank), take(d, "d_c", o.d_c), take(d, "d_r", o.d_r);
  take(d, "d_v", o.d_v), take(d, "causal", o.causal), take(d, "ref_bits", o.ref_bits);
  take(d, "config_json", o.config_json), take(d, "round_inputs", o.round_inputs);
  take(d, "layout", o.layout), take(d, "page_size", o.page_size);
  if (d.contains("inputs") && !d["inputs"].is_none()) o.inputs = arrays(d["inputs"]);
  return o;
}

}  // namespace

PYBIND11_MODULE(_qkmla, m) {
  m.doc() = "qkmla's C++ API (use the qkmla package, not this module)";
  py::register_exception<std::invalid_argument>(m, "QkmlaError", PyExc_ValueError);
  py::class_<qkmla::api::GoldenCase>(m, "GoldenCase")
      .def("config_json", &qkmla::api::GoldenCase::config_json)
      .def("names", &qkmla::api::GoldenCase::names)
      .def("tensor", [](const qkmla::api::GoldenCase& c,
                        const std::string& n) { return from_array(c.tensor(n)); })
      .def("metadata", &qkmla::api::GoldenCase::metadata)
      .def("save", &qkmla::api::GoldenCase::save);
  m.def("golden", [](const py::dict& d) {
    const qkmla::api::CaseOptions o = case_options(d);
    py::gil_scoped_release release;
    return qkmla::api::golden(o);
  });
  m.def("load", &qkmla::api::load);
  m.def("audit", [](const qkmla::api::GoldenCase& c, const py::dict& outputs, const py::dict& d) {
    qkmla::api::AuditOptions o;
    take(d, "label", o.label), take(d, "lse_base", o.lse_base), take(d, "empty_lse", o.empty_lse);
    take(d, "form", o.form), take(d, "design", o.design), take(d, "diagnose", o.diagnose);
    take(d, "kv_chunk", o.kv_chunk);
    take(d, "layout", o.layout);
    const std::map<std::string, Array> given = arrays(outputs);
    qkmla::api::Verdict v;
    {
      py::gil_scoped_release release;
      v = qkmla::api::audit(c, given, o);
    }
    py::list rows;
    for (const auto& r : v.rows)
      rows.append(py::dict(
          py::arg("tensor") = r.tensor, py::arg("passed") = r.passed, py::arg("rel_l2") = r.rel_l2,
          py::arg("max_ulp") = r.max_ulp, py::arg("baseline_ratio") = r.baseline_ratio,
          py::arg("yardstick") = r.yardstick, py::arg("nonfinite_mismatch") = r.nonfinite_mismatch,
          py::arg("failed") = r.failed));
    return py::dict(py::arg("passed") = v.passed, py::arg("rows") = rows,
                    py::arg("diagnosis") = v.diagnosis, py::arg("missing") = v.missing,
                    py::arg("table") = v.table, py::arg("json") = v.json);
  });
}

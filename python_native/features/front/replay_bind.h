// Replay's Python side of the front: claiming and filling a pending call, reading a table, the
// test stand-in's switch and log.
//
// A launch arrives from Python as ``(function, grid, block, shared, cluster, cooperative, pdl,
// params)``, each param a ``(code, value)`` pair: ``"p"`` with a tensor or None (a pointer), or an
// integer or float type code (``"i32"``, ``"u64"``, ``"f32"``, ``"bf16"``...) with a number.

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <string>

#include "replay_table.h"

namespace pn_replay {

namespace py = pybind11;

// The byte size of a number type code, 0 for an unknown code.
inline uint8_t code_size(const std::string& code) {
  if (code == "i1" || code == "u1" || code == "i8" || code == "u8") return 1;
  if (code == "i16" || code == "u16" || code == "f16" || code == "bf16") return 2;
  if (code == "i32" || code == "u32" || code == "f32") return 4;
  if (code == "i64" || code == "u64" || code == "f64") return 8;
  return 0;
}

// A number's bits as the kernel parameter of ``code`` holds them.
inline uint64_t number_bits(const std::string& code, const py::handle& value) {
  if (code[0] == 'f' || code[0] == 'b') {
    const double d = value.cast<double>();
    if (code == "f64") {
      uint64_t bits;
      std::memcpy(&bits, &d, 8);
      return bits;
    }
    if (code == "f16") return c10::Half(static_cast<float>(d)).x;
    if (code == "bf16") return c10::BFloat16(static_cast<float>(d)).x;
    const float f = static_cast<float>(d);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return bits;
  }
  const uint64_t raw = code[0] == 'u' ? value.cast<uint64_t>() : static_cast<uint64_t>(value.cast<int64_t>());
  const uint8_t size = code_size(code);
  return size == 8 ? raw : raw & ((uint64_t{1} << (8 * size)) - 1);
}

inline uint32_t dim(const py::tuple& t, size_t i) { return t[i].cast<uint32_t>(); }

// One launch from Python; throws ``ValueError`` naming what is wrong with it.
inline DraftLaunch draft_launch(const py::handle& item) {
  const auto t = item.cast<py::tuple>();
  if (t.size() != 8) throw py::value_error("a launch is (function, grid, block, shared, cluster, cooperative, pdl, params)");
  DraftLaunch d;
  d.shape.function = t[0].cast<uint64_t>();
  const auto grid = t[1].cast<py::tuple>(), block = t[2].cast<py::tuple>(), cluster = t[4].cast<py::tuple>();
  for (size_t i = 0; i < 3; ++i) {
    d.shape.grid[i] = dim(grid, i);
    d.shape.block[i] = dim(block, i);
    d.shape.cluster[i] = dim(cluster, i);
  }
  d.shape.shared = t[3].cast<uint32_t>();
  d.shape.cooperative = t[5].cast<bool>();
  d.shape.pdl = t[6].cast<bool>();
  for (const auto& entry : t[7].cast<py::list>()) {
    const auto pair = entry.cast<py::tuple>();
    const auto code = pair[0].cast<std::string>();
    DraftParam p;
    if (code == "p") {
      if (!pair[1].is_none()) p.tensor = pair[1].cast<at::Tensor>();
    } else {
      p.size = code_size(code);
      if (p.size == 0) throw py::value_error("unknown parameter type code '" + code + "'");
      p.bits = number_bits(code, pair[1]);
    }
    d.params.push_back(std::move(p));
  }
  return d;
}

inline py::dict describe_shape(const LaunchShape& s) {
  py::dict d;
  d["function"] = s.function;
  d["grid"] = py::make_tuple(s.grid[0], s.grid[1], s.grid[2]);
  d["block"] = py::make_tuple(s.block[0], s.block[1], s.block[2]);
  d["cluster"] = py::make_tuple(s.cluster[0], s.cluster[1], s.cluster[2]);
  d["shared"] = s.shared;
  d["cooperative"] = s.cooperative;
  d["pdl"] = s.pdl;
  return d;
}

inline py::dict describe_record(const Record& r) {
  static const char* kinds[] = {"launches", "fallback", "python"};
  static const char* params[] = {"const", "input", "buffer"};
  py::dict d;
  d["kind"] = kinds[static_cast<int>(r.kind)];
  d["key"] = r.key;
  d["device"] = r.device.str();
  d["buffers"] = r.buffers;
  d["why"] = r.why;
  py::list launches;
  for (const Launch& l : r.launches) {
    py::dict ld = describe_shape(l.shape);
    py::list ps;
    for (const Param& p : l.params) ps.append(py::make_tuple(params[p.kind], p.size, p.index, p.offset, p.bits));
    ld["params"] = ps;
    launches.append(ld);
  }
  d["launches"] = launches;
  py::list outputs;
  for (const Output& o : r.outputs) {
    if (o.buffer < 0) {
      outputs.append(o.undefined ? py::object(py::str("undefined")) : py::object(py::none()));
      continue;
    }
    outputs.append(py::make_tuple(o.buffer, static_cast<int>(o.dtype), o.offset, o.sizes, o.strides));
  }
  d["outputs"] = outputs;
  return d;
}

inline py::dict describe_counters(Table& table) {
  py::dict d;
  d["records"] = table.size();
  d["capacity"] = table.capacity();
  d["replayed"] = table.counters.replayed.load();
  d["fallbacks"] = table.counters.fallbacks.load();
  d["to_python"] = table.counters.to_python.load();
  d["recorded"] = table.counters.recorded.load();
  d["refused"] = table.counters.refused.load();
  d["stale"] = table.counters.stale.load();
  return d;
}

// Replay's methods on the front's Python class; ``table_of(front)`` is the front's table.
template <class FrontT, class TableOf>
void bind_front(py::class_<FrontT>& cls, TableOf table_of) {
  cls.def("replay_view", [table_of](FrontT& f) {
        static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "the epoch view is a plain uint32");
        return py::memoryview::from_memory(static_cast<void*>(&table_of(f).epoch), sizeof(uint32_t), false);
      })
      .def("replay_claim", [table_of](FrontT& f) { return claim(table_of(f)) != nullptr; })
      .def("replay_submit", [table_of](FrontT& f, const py::list& launches, const std::string& problem) {
        Pending* p = claimed(table_of(f));
        if (p == nullptr) throw py::value_error("no claimed call of this front on this thread");
        p->submitted = true;
        p->problem = problem;
        if (!problem.empty()) return;
        try {
          for (const auto& item : launches) p->launches.push_back(draft_launch(item));
        } catch (const std::exception& e) {  // a launch replay cannot take: this key keeps the Python path
          p->problem = std::string("a launch could not be read: ") + e.what();
          p->launches.clear();
        }
      })
      .def("replay_stats", [table_of](FrontT& f) { return describe_counters(table_of(f)); })
      .def("replay_records", [table_of](FrontT& f) {
        py::list out;
        for (const auto& r : table_of(f).snapshot()) out.append(describe_record(*r));
        return out;
      })
      .def("replay_clear", [table_of](FrontT& f) { table_of(f).clear(); })
      .def_property("replay_capacity", [table_of](FrontT& f) { return table_of(f).capacity(); },
                    [table_of](FrontT& f, size_t n) { table_of(f).set_capacity(n); });
}

inline void bind_module(py::module_& m) {
  m.def("replay_select_test_launch", [](bool on) {
    TestLaunch::instance().take();
    test_launch_selected().store(on, std::memory_order_release);
  }, "Tests only: replays of CPU calls go to the recording stand-in (True) or to Python (False).");
  m.def("replay_test_launches", [] {
    py::list out;
    for (const LoggedLaunch& l : TestLaunch::instance().take()) {
      py::dict d = describe_shape(l.shape);
      d["params"] = l.params;
      out.append(d);
    }
    return out;
  }, "Tests only: what the stand-in was given since the last call, oldest first.");
  m.def("replay_driver_problem", [] { return CudaDriver::why(); },
        "Why the CUDA driver cannot launch replays here ('' when it can).");
  m.attr("REPLAY_TEST_KERNEL") = TestLaunch::kTestKernel;
}

}  // namespace pn_replay

// The compiled dispatch front: one boxed kernel per slot, registered above the slot's Python router.
//
// Per call it decides, without entering Python, whether the Python router can have anything to
// do: a slot with nothing active, or a call every active override's calibration gate surely
// declines (by dtype, row width class and size bucket of the first tensor argument), goes
// straight to the kernel the slot shadows. The width class follows the gates' own rule: rows at
// least ``wide_row`` long are wide, a value the panel hands each front when it makes it. Everything else is handed, boxed, to the Python
// router registered below it. The state the panel changes (mode, masks) is atomic; the two
// kernels a front holds are fixed for its life (a changed kernel below means a new front).

#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "replay_bind.h"

namespace py = pybind11;

namespace {

constexpr int kDtypeSlots = 64;  // above every c10::ScalarType value
const char* kMarker = "python_native compiled front";

enum Mode : uint32_t {
  kPython = 0,    // every call enters the Python router
  kFallback = 1,  // nothing can fire: every call goes to the shadowed kernel
  kGated = 2,     // calls the masks surely decline go to the shadowed kernel, the rest to Python
};

struct State {
  std::atomic<uint32_t> mode{kPython};
  // masks[dtype][wide]: bit b set = surely declined at size bucket b (numel.bit_length()).
  std::atomic<uint64_t> masks[kDtypeSlots][2];
  std::atomic<int64_t> inflight{0};
  std::vector<size_t> positional;  // indices of the schema's positional arguments
  size_t nargs = 0;
  int64_t wide_row = 0;  // rows at least this long are wide (the gates' rule, fixed for the front's life)
  pn_replay::Table replay;  // recorded launches, served without Python (replay_table.h)

  State() {
    for (auto& per_dtype : masks) {
      per_dtype[0].store(0, std::memory_order_relaxed);
      per_dtype[1].store(0, std::memory_order_relaxed);
    }
  }
};

// Registering above our own router always "overrides a previously registered kernel": the
// dispatcher's warning about it says nothing the user can act on.
class SilentWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning&) override {}
};

int bucket_of(int64_t numel) {
  if (numel <= 0) return 0;
  return 64 - __builtin_clzll(static_cast<uint64_t>(numel));
}

class FrontKernel final : public c10::OperatorKernel {
 public:
  FrontKernel(std::shared_ptr<State> state, c10::SafeKernelFunction shadowed, c10::SafeKernelFunction python)
      : state_(std::move(state)), shadowed_(std::move(shadowed)), python_(std::move(python)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
    State& s = *state_;
    s.inflight.fetch_add(1, std::memory_order_acq_rel);
    struct Leave {
      std::atomic<int64_t>& n;
      ~Leave() { n.fetch_sub(1, std::memory_order_acq_rel); }
    } leave{s.inflight};
    const uint32_t mode = s.mode.load(std::memory_order_acquire);
    if (mode == kFallback || (mode == kGated && declined(s, *stack))) {
      // The kernel below went away (its library was destroyed; the stack is then untouched):
      // the Python router captures the new one. Any other error is the kernel's own.
      if (!call_intact(shadowed_, op, keyset, stack)) python_.callBoxed(op, keyset, stack);
      return;
    }
    if (s.replay.on() && pn_replay::run(s.replay, s.nargs, op, stack,
                                        [&] { return call_intact(shadowed_, op, keyset, stack); },
                                        [&] { return call_intact(python_, op, keyset, stack); })) {
      return;
    }
    // Our router's registration gone first (only while the interpreter shuts down): the kernel below serves.
    if (!call_intact(python_, op, keyset, stack)) shadowed_.callBoxed(op, keyset, stack);
  }

 private:
  // Calls ``kernel``; false when it refused before touching the stack (an invalidated kernel).
  static bool call_intact(const c10::SafeKernelFunction& kernel, const c10::OperatorHandle& op,
                          c10::DispatchKeySet keyset, torch::jit::Stack* stack) {
    const size_t before = stack->size();
    try {
      kernel.callBoxed(op, keyset, stack);
      return true;
    } catch (const c10::Error& e) {
      if (stack->size() != before || std::string(e.what()).find("invalidated") == std::string::npos) throw;
      return false;
    }
  }

  static bool declined(const State& s, const torch::jit::Stack& stack) {
    // Fewer arguments than the schema this front was made for: the op was defined again under it
    // (the slot is replaced at its next registration); never read below the stack.
    if (stack.size() < s.nargs) return false;
    const c10::IValue* args = stack.data() + (stack.size() - s.nargs);
    for (size_t i : s.positional) {
      const c10::IValue& v = args[i];
      if (!v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      const int dtype = static_cast<int>(t.scalar_type());
      if (dtype < 0 || dtype >= kDtypeSlots) return false;
      const int bucket = bucket_of(t.numel());
      if (bucket > 63) return false;
      const int wide = (t.dim() > 0 && t.sizes().back() >= s.wide_row) ? 1 : 0;
      return (s.masks[dtype][wide].load(std::memory_order_relaxed) >> bucket) & 1;
    }
    return false;  // no tensor argument: the gates let the cond decide
  }

  std::shared_ptr<State> state_;
  c10::SafeKernelFunction shadowed_;
  c10::SafeKernelFunction python_;
};

// One slot's front: its state, and its registration (a torch::Library of its own) while installed.
// After uninstall() it keeps its kernel alive (keepalive_) until it is destroyed, so a call that
// looked the kernel up just before the registration went still finds it whole; the owner destroys
// it only once inflight() is 0 and a grace period has passed.
class Front {
 public:
  Front(const std::string& name, const std::string& overload, const std::string& key, py::object shadowed,
        py::object python, int64_t wide_row)
      : state_(std::make_shared<State>()),
        name_(name),
        overload_(overload),
        key_(c10::parseDispatchKey(key)),
        shadowed_(shadowed.cast<c10::SafeKernelFunction>()),
        python_(python.cast<c10::SafeKernelFunction>()) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name_.c_str(), overload_.c_str());
    const auto& args = op.schema().arguments();
    state_->nargs = args.size();
    if (wide_row < 1) throw py::value_error("wide_row must be a positive row length");
    state_->wide_row = wide_row;
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].kwarg_only()) state_->positional.push_back(i);
    }
  }

  void install() {
    if (keepalive_) throw std::runtime_error("a front is installed once; make a new one");
    const auto ns = name_.substr(0, name_.find("::"));
    const auto op = name_.substr(name_.find("::") + 2) + (overload_.empty() ? "" : "." + overload_);
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard quiet(&silent);
    library_ = std::make_unique<torch::Library>(torch::Library::IMPL, ns, key_, kMarker, 0);
    library_->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                   std::make_unique<FrontKernel>(state_, shadowed_, python_)));
    auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name_.c_str(), overload_.c_str());
    keepalive_.emplace(handle.getComputedKernelForDispatchKey(key_));
  }

  void uninstall() { library_.reset(); }

  bool installed() const { return library_ != nullptr; }

  void set_mode(uint32_t mode) { state_->mode.store(mode, std::memory_order_release); }

  uint32_t mode() const { return state_->mode.load(std::memory_order_acquire); }

  // The mode's four bytes, writable from Python (a memoryview store costs a tenth of a bound call).
  // Only for modes that need no masks: an aligned 32-bit store is single-copy atomic on the
  // targets torch supports, and fallback or python mode reads nothing else the store must publish;
  // gated mode goes through set_masks and set_mode, whose release store publishes the masks.
  // Valid while this Front lives: the panel drops the view before it lets the Front go.
  py::memoryview mode_view() {
    static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "the mode view is a plain uint32");
    return py::memoryview::from_memory(static_cast<void*>(&state_->mode), sizeof(uint32_t), false);
  }

  void set_masks(const py::list& masks) {
    uint64_t fresh[kDtypeSlots][2] = {};
    for (const auto& item : masks) {
      auto entry = item.cast<py::tuple>();
      const int dtype = entry[0].cast<int>();
      if (dtype < 0 || dtype >= kDtypeSlots) throw py::value_error("dtype index out of range");
      fresh[dtype][0] = entry[1].cast<uint64_t>();
      fresh[dtype][1] = entry[2].cast<uint64_t>();
    }
    for (int d = 0; d < kDtypeSlots; ++d) {
      state_->masks[d][0].store(fresh[d][0], std::memory_order_relaxed);
      state_->masks[d][1].store(fresh[d][1], std::memory_order_relaxed);
    }
  }

  int64_t inflight() const { return state_->inflight.load(std::memory_order_acquire); }

  int64_t wide_row() const { return state_->wide_row; }
  pn_replay::Table& replay_table() { return state_->replay; }

 private:
  std::shared_ptr<State> state_;
  std::string name_;
  std::string overload_;
  c10::DispatchKey key_;
  c10::SafeKernelFunction shadowed_;
  c10::SafeKernelFunction python_;
  std::unique_ptr<torch::Library> library_;
  std::optional<c10::SafeKernelFunction> keepalive_;
};

py::dict scalar_types() {
  py::dict out;
#define PN_SCALAR_TYPE(_, name) out[#name] = static_cast<int>(c10::ScalarType::name);
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(PN_SCALAR_TYPE)
#undef PN_SCALAR_TYPE
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "python-native's compiled dispatch front";
  m.attr("MARKER") = kMarker;
  m.attr("MODE_PYTHON") = static_cast<int>(kPython);
  m.attr("MODE_FALLBACK") = static_cast<int>(kFallback);
  m.attr("MODE_GATED") = static_cast<int>(kGated);
  m.def("scalar_types", &scalar_types);
  pn_replay::bind_module(m);
  auto front = py::class_<Front>(m, "Front");
  pn_replay::bind_front(front, [](Front& f) -> pn_replay::Table& { return f.replay_table(); });
  front
      .def(py::init<const std::string&, const std::string&, const std::string&, py::object, py::object, int64_t>())
      .def("install", &Front::install)
      .def("uninstall", &Front::uninstall)
      .def_property_readonly("installed", &Front::installed)
      .def("set_mode", &Front::set_mode)
      .def_property_readonly("mode", &Front::mode)
      .def("mode_view", &Front::mode_view)
      .def("set_masks", &Front::set_masks)
      .def_property_readonly("inflight", &Front::inflight)
      .def_property_readonly("wide_row", &Front::wide_row);
}

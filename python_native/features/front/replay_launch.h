// Where a replayed launch goes: the CUDA driver, or (in tests) a stand-in that records what it was given.
//
// The driver is opened at run time (``dlopen("libcuda.so.1")``), so the front builds and loads on
// machines without CUDA; its launch mirrors the launcher Triton generates per kernel:
// ``cuLaunchKernelEx`` on the current stream of the inputs' device, grid x multiplied by the
// cluster size, ``32 * num_warps`` threads, the kernel's dynamic shared memory, and the
// cooperative, programmatic-serialization and cluster attributes where the kernel has them. The
// few driver types used are declared here with cuda.h's layout (checked by static_assert).

#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace pn_replay {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "parameters are passed as the low bytes of 8-byte slots");

// One kernel launch of a record: everything but its parameters' values.
struct LaunchShape {
  uint64_t function = 0;  // the loaded kernel (a CUfunction on CUDA)
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t cluster[3] = {1, 1, 1};
  uint32_t shared = 0;
  bool cooperative = false;
  bool pdl = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The stream launches go to on ``device`` (its current one); makes the device's context current.
  virtual void* stream(const c10::Device& device) = 0;
  // Whether ``stream`` is being captured into a graph now (records are not declared capture-safe).
  virtual bool capturing(void* stream) = 0;
  // Launches; ``params[i]`` points at the i-th kernel parameter. Raises on failure.
  virtual void launch(const LaunchShape& shape, void** params, size_t n_params, void* stream) = 0;
};

// ----- the CUDA driver -----

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUstream = void*;
using CUfunction = void*;

struct CuLaunchAttribute {
  int id;
  char pad[4];
  union {
    char raw[64];
    void* align;
    struct {
      unsigned int x, y, z;
    } cluster;
    int value;
  } value;
};
static_assert(sizeof(CuLaunchAttribute) == 72, "CUlaunchAttribute's layout");

struct CuLaunchConfig {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CuLaunchAttribute* attrs;
  unsigned int numAttrs;
};
static_assert(sizeof(CuLaunchConfig) == 56, "CUlaunchConfig's layout");

constexpr int kAttrCooperative = 2;
constexpr int kAttrClusterDimension = 4;
constexpr int kAttrClusterSchedulingPolicy = 5;
constexpr int kAttrProgrammaticSerialization = 6;
constexpr int kClusterSchedulingSpread = 1;

class CudaDriver final : public Backend {
 public:
  // The process's driver, or nullptr when libcuda cannot be opened (``why()`` says why).
  static CudaDriver* get() {
    static CudaDriver* driver = [] {
      auto* d = new CudaDriver();
      if (!d->open()) {
        why_text() = d->problem_;
        delete d;
        return static_cast<CudaDriver*>(nullptr);
      }
      return d;
    }();
    return driver;
  }

  static std::string why() {
    get();
    return why_text();
  }

  void* stream(const c10::Device& device) override {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    CUcontext context = nullptr;
    check(ctx_get_current_(&context), "cuCtxGetCurrent");
    if (context == nullptr) {  // a thread that never touched CUDA: the device's primary context
      CUdevice handle = 0;
      check(device_get_(&handle, device.index()), "cuDeviceGet");
      check(primary_retain_(&context, handle), "cuDevicePrimaryCtxRetain");
      check(ctx_set_current_(context), "cuCtxSetCurrent");
    }
    return impl->getStream(device).native_handle();
  }

  bool capturing(void* stream) override {
    int status = 0;
    check(is_capturing_(stream, &status), "cuStreamIsCapturing");
    return status != 0;
  }

  void launch(const LaunchShape& s, void** params, size_t, void* stream) override {
    if (static_cast<uint64_t>(s.grid[0]) * s.grid[1] * s.grid[2] == 0) return;  // as Triton: nothing to run
    CuLaunchAttribute attrs[4] = {};
    unsigned int n = 0;
    if (s.pdl) {
      attrs[n].id = kAttrProgrammaticSerialization;
      attrs[n++].value.value = 1;
    }
    if (s.cooperative) {
      attrs[n].id = kAttrCooperative;
      attrs[n++].value.value = 1;
    }
    if (s.cluster[0] * s.cluster[1] * s.cluster[2] != 1) {
      attrs[n].id = kAttrClusterDimension;
      attrs[n].value.cluster.x = s.cluster[0];
      attrs[n].value.cluster.y = s.cluster[1];
      attrs[n++].value.cluster.z = s.cluster[2];
      attrs[n].id = kAttrClusterSchedulingPolicy;
      attrs[n++].value.value = kClusterSchedulingSpread;
    }
    CuLaunchConfig config{s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1], s.block[2], s.shared,
                          stream, attrs, n};
    check(launch_(&config, reinterpret_cast<CUfunction>(s.function), params, nullptr), "cuLaunchKernelEx");
  }

 private:
  bool open() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* error = dlerror();
      problem_ = std::string("libcuda.so.1 cannot be opened: ") + (error ? error : "unknown error");
      return false;
    }
    return find(lib, "cuLaunchKernelEx", launch_) && find(lib, "cuStreamIsCapturing", is_capturing_) &&
           find(lib, "cuCtxGetCurrent", ctx_get_current_) && find(lib, "cuCtxSetCurrent", ctx_set_current_) &&
           find(lib, "cuDeviceGet", device_get_) && find(lib, "cuDevicePrimaryCtxRetain", primary_retain_) &&
           find(lib, "cuGetErrorString", error_string_);
  }

  template <class Fn>
  bool find(void* lib, const char* name, Fn& out) {
    out = reinterpret_cast<Fn>(dlsym(lib, name));
    if (out == nullptr) problem_ = std::string("libcuda.so.1 has no ") + name + " (a CUDA 12 driver is needed)";
    return out != nullptr;
  }

  void check(CUresult code, const char* what) {
    if (code == 0) return;
    const char* text = nullptr;
    error_string_(code, &text);
    TORCH_CHECK(false, "python_native replay: ", what, " failed: ", text ? text : "unknown CUDA error", " (", code, ")");
  }

  static std::string& why_text() {
    static std::string text;
    return text;
  }

  std::string problem_;
  CUresult (*launch_)(const CuLaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*is_capturing_)(CUstream, int*) = nullptr;
  CUresult (*ctx_get_current_)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current_)(CUcontext) = nullptr;
  CUresult (*device_get_)(CUdevice*, int) = nullptr;
  CUresult (*primary_retain_)(CUcontext*, CUdevice) = nullptr;
  CUresult (*error_string_)(CUresult, const char**) = nullptr;
};

// ----- the stand-in launch of the tests -----

// What one stand-in launch was given.
struct LoggedLaunch {
  LaunchShape shape;
  std::vector<uint64_t> params;  // each parameter's 8-byte slot
};

// A stand-in for the GPU, selected by a test-only setter: replays of CPU calls come here. It
// records every launch; the one kernel it knows (``kTestKernel``) it also runs, on the host:
// ``out[i] = a[i] + alpha * b[i] + c`` over ``n`` float32 elements (parameters: a, b, out
// pointers, n int64, alpha and c float32), so that threaded tests can check replayed results.
class TestLaunch final : public Backend {
 public:
  static constexpr uint64_t kTestKernel = 0x7e57;

  static TestLaunch& instance() {
    static TestLaunch* stand_in = new TestLaunch();
    return *stand_in;
  }

  void* stream(const c10::Device&) override { return nullptr; }
  bool capturing(void*) override { return false; }

  void launch(const LaunchShape& s, void** params, size_t n_params, void*) override {
    LoggedLaunch entry{s, {}};
    for (size_t i = 0; i < n_params; ++i) entry.params.push_back(*static_cast<const uint64_t*>(params[i]));
    if (s.function == kTestKernel) run_test_kernel(entry.params);
    std::lock_guard<std::mutex> hold(mu_);
    if (log_.size() < 100000) log_.push_back(std::move(entry));
  }

  std::vector<LoggedLaunch> take() {
    std::lock_guard<std::mutex> hold(mu_);
    std::vector<LoggedLaunch> out;
    out.swap(log_);
    return out;
  }

 private:
  static void run_test_kernel(const std::vector<uint64_t>& p) {
    TORCH_CHECK(p.size() >= 6, "the test kernel takes a, b, out, n, alpha, c");
    const auto* a = reinterpret_cast<const float*>(p[0]);
    const auto* b = reinterpret_cast<const float*>(p[1]);
    auto* out = reinterpret_cast<float*>(p[2]);
    const auto n = static_cast<int64_t>(p[3]);
    float alpha, c;
    const auto alpha_bits = static_cast<uint32_t>(p[4]);
    const auto c_bits = static_cast<uint32_t>(p[5]);
    std::memcpy(&alpha, &alpha_bits, 4);
    std::memcpy(&c, &c_bits, 4);
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + alpha * b[i] + c;
  }

  std::mutex mu_;
  std::vector<LoggedLaunch> log_;
};

// Whether CPU replays go to the stand-in (tests only).
inline std::atomic<bool>& test_launch_selected() {
  static std::atomic<bool> selected{false};
  return selected;
}

// The backend that launches a record for ``device``, or nullptr (the call then goes to Python).
inline Backend* backend_for(const c10::Device& device) {
  if (device.is_cuda()) return CudaDriver::get();
  if (device.is_cpu() && test_launch_selected().load(std::memory_order_acquire)) return &TestLaunch::instance();
  return nullptr;
}

}  // namespace pn_replay

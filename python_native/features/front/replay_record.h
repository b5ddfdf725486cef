// Replay records: what a replayable impl did for one key, and doing it again for a later call.
//
// A record is made from the launches the impl made (handed over from Python, with the tensors
// they were given) and the outputs the call returned. Each pointer a launch was given becomes a
// reference: to an input argument whose elements' address range holds it (plus a byte offset),
// or to a buffer the impl allocated (an output's memory or its scratch, plus an offset). Outputs
// become views of those buffers (dtype, storage offset, sizes, strides). Everything else is a
// constant. Anything that does not fit (an output no launch wrote, one that shares an input's
// memory, a tensor on another device, a pointer into an input's storage outside its elements)
// refuses the record, with why: such a call keeps the Python path.

#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "replay_key.h"
#include "replay_launch.h"

namespace pn_replay {

enum ParamKind : uint8_t { kConst = 0, kInput = 1, kBuffer = 2 };

struct Param {
  ParamKind kind = kConst;
  uint8_t size = 8;     // bytes of a constant
  int32_t index = 0;    // the input argument or buffer
  int64_t offset = 0;   // bytes past its data pointer
  uint64_t bits = 0;    // a constant's value
};

struct Launch {
  LaunchShape shape;
  std::vector<Param> params;
};

struct Output {
  int32_t buffer = -1;  // -1: no tensor (None, or an undefined tensor where ``undefined``)
  bool undefined = false;
  c10::ScalarType dtype = c10::kFloat;
  int64_t offset = 0;   // elements into the buffer
  std::vector<int64_t> sizes, strides;
};

enum class Kind : uint8_t {
  kLaunches,  // allocate the buffers, launch, return the outputs
  kFallback,  // every override declined: the shadowed kernel serves
  kPython,    // the call is not replayable: straight to Python, without recording again
};

struct Record {
  Kind kind = Kind::kPython;
  std::vector<int64_t> key;
  uint64_t hash = 0;
  uint32_t epoch = 0;
  c10::Device device{c10::kCPU};
  std::vector<int64_t> buffers;  // bytes of each buffer
  std::vector<Output> outputs;
  std::vector<Launch> launches;
  std::string why;  // kPython: why the call is not replayed
  mutable std::atomic<uint64_t> used{0};  // the table's clock when last found
};

// A launch as Python handed it over: its tensors not yet placed.
struct DraftParam {
  at::Tensor tensor;  // defined for a pointer to a tensor
  ParamKind kind = kConst;
  uint8_t size = 8;
  uint64_t bits = 0;
};

struct DraftLaunch {
  LaunchShape shape;
  std::vector<DraftParam> params;
};

// Where a launch's tensor lives: an input argument, else a buffer of the call (added on first sight).
class Placer {
 public:
  Placer(Record& record, const std::vector<c10::IValue>& inputs) : record_(record), inputs_(inputs) {}

  // Sets ``out`` to where ``t`` lives; returns why it cannot be placed (empty when it can). A
  // pointer into an input's elements is placed by address, relative to the first input whose
  // bytes hold it: the key names every overlap of the inputs and the distance between their
  // pointers, so in any call of the key that is the same place of the same memory.
  std::string place(const at::Tensor& t, Param& out) {
    if (t.device() != record_.device) return "a launch was given a tensor on another device";
    const auto address = reinterpret_cast<uintptr_t>(t.const_data_ptr());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const at::Tensor* input = tensor_at(i);
      if (input != nullptr && byte_range(*input).holds(address)) {
        out.kind = kInput;
        out.index = static_cast<int32_t>(i);
        out.offset = static_cast<int64_t>(address - reinterpret_cast<uintptr_t>(input->const_data_ptr()));
        return "";
      }
    }
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (shares_input_memory(storage)) return "a launch was given an input's memory outside the input's elements";
    out.kind = kBuffer;
    out.index = buffer_of(storage);
    out.offset = static_cast<int64_t>(address - reinterpret_cast<uintptr_t>(storage->data()));
    return "";
  }

  // Sets ``out`` from a returned value; returns why it cannot be replayed (empty when it can).
  std::string output(const c10::IValue& v, Output& out) {
    if (v.isNone()) return "";
    if (!v.isTensor()) return "the op returns something other than tensors";
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {  // a Tensor return left out (a gradient not asked for)
      out.undefined = true;
      return "";
    }
    if (t.device() != record_.device || t.layout() != c10::kStrided || t.is_conj() || t.is_neg()) {
      return "an output is not a plain strided tensor on the call's device";
    }
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (shares_input_memory(storage)) return "an output shares an input's memory";
    for (size_t b = 0; b < storages_.size(); ++b) {
      if (storages_[b] == storage) {
        out.buffer = static_cast<int32_t>(b);
        out.dtype = t.scalar_type();
        out.offset = t.storage_offset();
        out.sizes.assign(t.sizes().begin(), t.sizes().end());
        out.strides.assign(t.strides().begin(), t.strides().end());
        return "";
      }
    }
    return "an output no recorded launch was given (written outside the launcher)";
  }

 private:
  const at::Tensor* tensor_at(size_t i) const {
    const c10::IValue& v = inputs_[i];
    if (!v.isTensor() || !v.toTensor().defined()) return nullptr;
    return &v.toTensor();
  }

  // Whether ``storage`` is an input's, or its bytes overlap an input's (another storage over its memory).
  bool shares_input_memory(const c10::StorageImpl* storage) const {
    const auto lo = reinterpret_cast<uintptr_t>(storage->data());
    const ByteRange bytes{lo, lo + storage->nbytes(), lo};
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const at::Tensor* input = tensor_at(i);
      if (input == nullptr) continue;
      if (input->storage().unsafeGetStorageImpl() == storage || bytes.overlaps(byte_range(*input))) return true;
    }
    return false;
  }

  int32_t buffer_of(const c10::StorageImpl* storage) {
    for (size_t b = 0; b < storages_.size(); ++b) {
      if (storages_[b] == storage) return static_cast<int32_t>(b);
    }
    storages_.push_back(storage);
    record_.buffers.push_back(static_cast<int64_t>(storage->nbytes()));
    return static_cast<int32_t>(storages_.size() - 1);
  }

  Record& record_;
  const std::vector<c10::IValue>& inputs_;
  std::vector<const c10::StorageImpl*> storages_;
};

// Fills ``record`` (device set) from the call's inputs, the launches and the returned values; the
// empty string, or why the call cannot be replayed.
inline std::string build_record(Record& record, const std::vector<c10::IValue>& inputs,
                                const std::vector<DraftLaunch>& drafts, const c10::IValue* returned, size_t n_returned) {
  if (drafts.empty()) return "the impl made no launch";
  Placer placer(record, inputs);
  for (const DraftLaunch& draft : drafts) {
    Launch launch{draft.shape, {}};
    for (const DraftParam& p : draft.params) {
      Param param;
      if (p.tensor.defined()) {
        std::string why = placer.place(p.tensor, param);
        if (!why.empty()) return why;
      } else {
        param.kind = kConst;
        param.size = p.size;
        param.bits = p.bits;
      }
      launch.params.push_back(param);
    }
    record.launches.push_back(std::move(launch));
  }
  for (size_t i = 0; i < n_returned; ++i) {
    Output out;
    std::string why = placer.output(returned[i], out);
    if (!why.empty()) return why;
    record.outputs.push_back(std::move(out));
  }
  record.kind = Kind::kLaunches;
  return "";
}

// Serves a call from ``record``: allocates its buffers on the record's device, launches through
// ``backend`` on ``stream``, and replaces the ``nargs`` arguments on the stack with the outputs.
inline void replay_record(const Record& record, torch::jit::Stack* stack, size_t nargs, Backend& backend,
                          void* stream) {
  c10::Allocator* allocator = c10::GetAllocator(record.device.type());
  c10::SmallVector<c10::Storage, 8> storages;
  for (const int64_t nbytes : record.buffers) {
    storages.emplace_back(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), nbytes, allocator->allocate(nbytes), allocator, /*resizable=*/false));
  }
  const c10::IValue* args = stack->data() + (stack->size() - nargs);
  c10::SmallVector<uint64_t, 32> values;
  c10::SmallVector<void*, 32> params;
  for (const Launch& launch : record.launches) {
    const size_t n = launch.params.size();
    values.resize(n);
    params.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const Param& p = launch.params[k];
      uint64_t value = p.bits;
      if (p.kind == kInput) {
        value = reinterpret_cast<uint64_t>(args[p.index].toTensor().const_data_ptr()) + p.offset;
      } else if (p.kind == kBuffer) {
        value = reinterpret_cast<uint64_t>(storages[p.index].mutable_data()) + p.offset;
      }
      values[k] = value;
      params[k] = &values[k];
    }
    backend.launch(launch.shape, params.data(), n, stream);
  }
  const c10::DispatchKeySet keys(c10::computeDispatchKey(std::nullopt, c10::kStrided, record.device));
  c10::SmallVector<c10::IValue, 4> results;
  for (const Output& out : record.outputs) {
    if (out.buffer < 0) {
      if (out.undefined) {
        results.emplace_back(at::Tensor());
      } else {
        results.emplace_back();
      }
      continue;
    }
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storages[out.buffer]), keys,
                                                     c10::scalarTypeToTypeMeta(out.dtype));
    impl->set_sizes_and_strides(out.sizes, out.strides, out.offset);
    results.emplace_back(at::Tensor(std::move(impl)));
  }
  torch::jit::drop(*stack, nargs);
  for (auto& r : results) stack->push_back(std::move(r));
}

}  // namespace pn_replay

// Replay keys: a call's specialization, read from its boxed arguments without entering Python.
//
// A key names everything a recorded launch list depends on: per tensor argument its dtype,
// device, sizes and strides (concrete tensors only: no SymInt is ever read), whether its data
// pointer is 16-byte aligned (what Triton specializes pointers on), and which earlier tensor
// arguments its memory overlaps (by address range, whatever storages hold them: two storages can
// share memory, ``torch.from_numpy`` twice over one buffer) and at what distance; every other
// argument by value (ints, floats by their bits, bools, lists of them, strings, devices). An
// argument of any other kind makes the call unkeyable: it goes to Python.

#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <cstring>

namespace pn_replay {

using Key = c10::SmallVector<int64_t, 64>;

enum Tag : int64_t {
  kNoneTag = 1,
  kTensorTag,
  kUndefinedTag,
  kIntTag,
  kDoubleTag,
  kBoolTag,
  kListTag,
  kStringTag,
  kDeviceTag,
  kAliasTag,
};

constexpr size_t kMaxTensors = 16;  // tensor arguments a keyed call may have

// What the key builder learns about a call besides its key.
struct CallInfo {
  c10::Device device{c10::kCPU};
  bool has_tensor = false;
};

inline int64_t double_bits(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline int64_t device_code(const c10::Device& d) {
  return static_cast<int64_t>(d.type()) * 1024 + static_cast<int64_t>(d.index()) + 1;
}

// The bytes a tensor's elements span, ``[lo, hi)``, and its data pointer, always inside (an empty
// tensor spans one byte at it): tensors whose ranges do not overlap have different data pointers.
// Overlap of these ranges, whatever storages hold them, is what replay keys and places pointers by.
struct ByteRange {
  uintptr_t lo, hi, data;  // no initializers: the key builder keeps an array of them per call

  bool overlaps(const ByteRange& o) const { return lo < o.hi && o.lo < hi; }
  bool holds(uintptr_t address) const { return lo <= address && address < hi; }
};

inline ByteRange byte_range(uintptr_t data, c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t item) {
  int64_t below = 0, above = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return {data, data + 1, data};
    const int64_t span = (sizes[d] - 1) * strides[d];
    (span < 0 ? below : above) += span;
  }
  return {data + below * item, data + (above + 1) * item, data};
}

inline ByteRange byte_range(const at::Tensor& t) {
  return byte_range(reinterpret_cast<uintptr_t>(t.const_data_ptr()), t.sizes(), t.strides(),
                    static_cast<int64_t>(t.itemsize()));
}

// Appends a concrete, strided tensor's part of the key and sets ``range`` to its bytes; false for
// anything else.
inline bool key_tensor(const at::Tensor& t, Key& key, ByteRange& range) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->has_symbolic_sizes_strides() || !impl->has_storage() || t.layout() != c10::kStrided || t.is_conj() ||
      t.is_neg()) {
    return false;
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  key.push_back(kTensorTag);
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(device_code(t.device()));
  key.push_back(static_cast<int64_t>(sizes.size()));
  key.append(sizes.begin(), sizes.end());
  key.append(strides.begin(), strides.end());
  const auto address = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  key.push_back(((address & 15) == 0 ? 1 : 0) | (impl->is_wrapped_number() ? 2 : 0));
  range = byte_range(address, sizes, strides, static_cast<int64_t>(t.itemsize()));
  return true;
}

inline bool key_scalar(const c10::IValue& v, Key& key) {
  if (v.isInt()) {
    key.push_back(kIntTag);
    key.push_back(v.toInt());
  } else if (v.isDouble()) {
    key.push_back(kDoubleTag);
    key.push_back(double_bits(v.toDouble()));
  } else if (v.isBool()) {
    key.push_back(kBoolTag);
    key.push_back(v.toBool() ? 1 : 0);
  } else {
    return false;
  }
  return true;
}

inline void key_string(const std::string& s, Key& key) {
  key.push_back(kStringTag);
  key.push_back(static_cast<int64_t>(s.size()));
  for (size_t i = 0; i < s.size(); i += 8) {
    int64_t word = 0;
    std::memcpy(&word, s.data() + i, std::min<size_t>(8, s.size() - i));
    key.push_back(word);
  }
}

// Tensors seen so far in a call: their memory, to key how later ones overlap it.
struct SeenTensors {
  ByteRange range[kMaxTensors];
  size_t count = 0;

  // Appends, per earlier tensor whose bytes ``r``'s overlap, its index and the distance between
  // their data pointers (nothing when none: distinct inputs); false past the limit.
  bool add(const ByteRange& r, Key& key) {
    if (count == kMaxTensors) return false;
    for (size_t j = 0; j < count; ++j) {
      if (r.overlaps(range[j])) {
        key.push_back(kAliasTag);
        key.push_back(static_cast<int64_t>(j));
        key.push_back(static_cast<int64_t>(r.data - range[j].data));
      }
    }
    range[count++] = r;
    return true;
  }
};

inline bool key_tensor_argument(const at::Tensor& t, Key& key, CallInfo& info, SeenTensors& seen) {
  if (!t.defined()) {
    key.push_back(kUndefinedTag);
    return true;
  }
  ByteRange range;
  if (!key_tensor(t, key, range)) return false;
  if (!info.has_tensor) {
    info.device = t.device();
    info.has_tensor = true;
  } else if (t.device() != info.device) {
    return false;  // one device per replayed call
  }
  return seen.add(range, key);
}

// The key of the ``n`` arguments at ``args``; false where the call cannot be keyed (it then goes to
// Python). A call without a tensor argument has no device to replay on: unkeyable too.
inline bool build_key(const c10::IValue* args, size_t n, Key& key, CallInfo& info) {
  SeenTensors seen;
  key.push_back(static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      if (!key_tensor_argument(v.toTensor(), key, info, seen)) return false;
    } else if (v.isNone()) {
      key.push_back(kNoneTag);
    } else if (key_scalar(v, key)) {
      continue;
    } else if (v.isList()) {
      const auto items = v.toListRef();
      key.push_back(kListTag);
      key.push_back(static_cast<int64_t>(items.size()));
      for (const c10::IValue& item : items) {
        if (!key_scalar(item, key)) return false;
      }
    } else if (v.isString()) {
      key_string(v.toStringRef(), key);
    } else if (v.isDevice()) {
      key.push_back(kDeviceTag);
      key.push_back(device_code(v.toDevice()));
    } else {
      return false;
    }
  }
  return info.has_tensor;
}

inline uint64_t hash_key(const Key& key) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const int64_t word : key) {
    h ^= static_cast<uint64_t>(word);
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace pn_replay

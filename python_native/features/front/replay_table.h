// A slot's replay records, and the front's replay step (serve a call from its record, or record it).
//
// A front whose slot may replay asks, on the path that would enter Python, for the record of the
// call's key: found, the call is served here (launches, the shadowed kernel, or Python for a key
// marked unreplayable); missed, the call goes to Python with a *pending* entry on this thread,
// which the replayable impl claims and fills with its launches (``replay_claim``/``replay_submit``),
// and which becomes the key's record once the router returns.
//
// The epoch (0: replay off) is written by the panel on every change that could change the answer
// (a refresh of the slot); a record made under another epoch is never served, and one that
// finishes after a change is never stored. Records are bounded per table, least recently used
// first out, and shared: a call holds its record while it replays it, whatever a clear does.

#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay_record.h"

namespace pn_replay {

class Table;

// A call on its way through Python, keyed, waiting for what its impl launches.
struct Pending {
  const Table* owner = nullptr;
  std::vector<int64_t> key;
  uint64_t hash = 0;
  uint32_t epoch = 0;
  c10::Device device{c10::kCPU};
  std::vector<c10::IValue> inputs;
  bool claimed = false;
  bool submitted = false;
  std::string problem;
  std::vector<DraftLaunch> launches;
};

// This thread's pending calls, innermost last (an impl may call other ops, each with its own).
inline std::vector<Pending*>& pending_calls() {
  thread_local std::vector<Pending*> calls;
  return calls;
}

struct Counters {
  std::atomic<uint64_t> replayed{0}, fallbacks{0}, to_python{0}, recorded{0}, refused{0}, stale{0};
};

class Table {
 public:
  std::atomic<uint32_t> epoch{0};  // 0: off; the panel writes it through a memoryview
  Counters counters;

  bool on() const { return epoch.load(std::memory_order_acquire) != 0; }

  std::shared_ptr<const Record> find(const Key& key, uint64_t hash, uint32_t now) {
    std::lock_guard<std::mutex> hold(mu_);
    auto it = map_.find(hash);
    if (it == map_.end()) return nullptr;
    const Record& r = *it->second;
    if (r.epoch != now) {  // out of date since a change: dropped now
      map_.erase(it);
      return nullptr;
    }
    if (r.key.size() != key.size() || !std::equal(key.begin(), key.end(), r.key.begin())) return nullptr;
    r.used.store(++clock_, std::memory_order_relaxed);
    return it->second;
  }

  // Stores ``record`` unless the epoch moved since its call began; evicts the least recently used past the cap.
  void insert(std::shared_ptr<Record> record) {
    std::lock_guard<std::mutex> hold(mu_);
    const uint32_t now = epoch.load(std::memory_order_acquire);
    if (record->epoch != now) {
      counters.stale.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    record->used.store(++clock_, std::memory_order_relaxed);
    map_[record->hash] = std::move(record);
    while (map_.size() > capacity_) evict_one(now);
  }

  void clear() {
    std::lock_guard<std::mutex> hold(mu_);
    map_.clear();
  }

  size_t size() {
    std::lock_guard<std::mutex> hold(mu_);
    return map_.size();
  }

  size_t capacity() {
    std::lock_guard<std::mutex> hold(mu_);
    return capacity_;
  }

  void set_capacity(size_t n) {
    std::lock_guard<std::mutex> hold(mu_);
    capacity_ = n < 1 ? 1 : n;
    while (map_.size() > capacity_) evict_one(epoch.load(std::memory_order_acquire));
  }

  // The records now, for inspection (copies of their shared pointers).
  std::vector<std::shared_ptr<const Record>> snapshot() {
    std::lock_guard<std::mutex> hold(mu_);
    std::vector<std::shared_ptr<const Record>> out;
    for (const auto& entry : map_) out.push_back(entry.second);
    return out;
  }

 private:
  // Drops an out-of-date record if there is one, else the least recently used (the caller holds mu_).
  void evict_one(uint32_t now) {
    auto victim = map_.begin();
    for (auto it = map_.begin(); it != map_.end(); ++it) {
      if (it->second->epoch != now) {
        victim = it;
        break;
      }
      if (it->second->used.load(std::memory_order_relaxed) < victim->second->used.load(std::memory_order_relaxed)) {
        victim = it;
      }
    }
    map_.erase(victim);
  }

  std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Record>> map_;
  size_t capacity_ = 64;
  uint64_t clock_ = 0;
};

// Makes the pending call's record once its Python call returned (the outputs on top of the stack).
inline void finish(Table& table, Pending& p, const torch::jit::Stack& stack, size_t n_returned) {
  auto record = std::make_shared<Record>();
  record->key = std::move(p.key);
  record->hash = p.hash;
  record->epoch = p.epoch;
  record->device = p.device;
  if (!p.claimed) {
    record->kind = Kind::kFallback;  // no override fired: every cond declined this key
  } else if (!p.submitted) {
    return;  // the impl raised and the router went on: nothing is known of this key
  } else if (!p.problem.empty()) {
    record->why = p.problem;
  } else if (stack.size() < n_returned) {
    record->why = "the router returned fewer values than the schema";
  } else {
    record->why = build_record(*record, p.inputs, p.launches, stack.data() + (stack.size() - n_returned), n_returned);
    if (!record->why.empty()) {  // a refused record keeps nothing of the call but why
      record->kind = Kind::kPython;
      record->launches.clear();
      record->outputs.clear();
      record->buffers.clear();
    }
  }
  (record->kind == Kind::kPython ? table.counters.refused : table.counters.recorded)
      .fetch_add(1, std::memory_order_relaxed);
  table.insert(std::move(record));
}

// The front's replay step, on the path that would enter Python. Serves the call from its record,
// or records it around ``python()`` (which calls the Python router: false when it could not);
// ``shadowed()`` calls the shadowed kernel (false likewise). Returns whether the call was served;
// false leaves the stack as it was, for the caller's own path to Python.
template <class Shadowed, class Python>
bool run(Table& table, size_t nargs, const c10::OperatorHandle& op, torch::jit::Stack* stack, Shadowed&& shadowed,
         Python&& python) {
  const uint32_t epoch = table.epoch.load(std::memory_order_acquire);
  if (epoch == 0 || stack->size() < nargs) return false;
  const c10::IValue* args = stack->data() + (stack->size() - nargs);
  Key key;
  CallInfo info;
  if (!build_key(args, nargs, key, info)) return false;
  Backend* backend = backend_for(info.device);
  if (backend == nullptr) return false;
  const uint64_t hash = hash_key(key);
  if (auto record = table.find(key, hash, epoch)) {
    if (record->kind == Kind::kPython) {
      table.counters.to_python.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (record->kind == Kind::kFallback) {
      if (!shadowed()) return false;  // its library went: Python captures the kernel below anew
      table.counters.fallbacks.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    c10::OptionalDeviceGuard guard;
    if (!info.device.is_cpu()) guard.reset_device(info.device);
    void* stream = backend->stream(info.device);
    if (backend->capturing(stream)) return false;
    replay_record(*record, stack, nargs, *backend, stream);
    table.counters.replayed.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  Pending p;
  p.owner = &table;
  p.key.assign(key.begin(), key.end());
  p.hash = hash;
  p.epoch = epoch;
  p.device = info.device;
  p.inputs.assign(args, args + nargs);
  auto& calls = pending_calls();
  calls.push_back(&p);
  struct Pop {
    std::vector<Pending*>& calls;
    ~Pop() { calls.pop_back(); }
  } pop{calls};
  if (!python()) return false;
  finish(table, p, *stack, op.schema().returns().size());
  return true;
}

// The innermost pending call of this thread, if ``table`` owns it and no impl claimed it yet: claimed now.
inline Pending* claim(const Table& table) {
  auto& calls = pending_calls();
  if (calls.empty() || calls.back()->owner != &table || calls.back()->claimed) return nullptr;
  calls.back()->claimed = true;
  return calls.back();
}

// The innermost pending call of this thread when ``table`` owns it and it was claimed, else nullptr.
inline Pending* claimed(const Table& table) {
  auto& calls = pending_calls();
  if (calls.empty() || calls.back()->owner != &table || !calls.back()->claimed) return nullptr;
  return calls.back();
}

}  // namespace pn_replay

// The floor of an aten-level statistics capture in C++ (bench/bench_native_floor.py), not part of the package.
//
// A thread-local RecordFunction observer, the hook torch's profiler uses: it sees every call through the
// dispatcher, forward and backward, without a Python call per op. It records the ops a TorchDispatchMode
// sees: the outermost call that runs a kernel (an op with a CompositeImplicitAutograd kernel only passes
// through to the ops it is made of, and the calls a kernel makes inside itself are not ops of the run).
// For each recorded op: its float inputs' statistics looked up by data pointer, numel and version (computed
// on a miss), its contiguous float outputs' computed, a row kept. No names, no module paths, no file.
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using Moments = std::array<double, 4>;  // sum, sum of squares, min, max (float64 sums, as _native.stats_at)

// Vectorised as precision_tool/_native.c's moments are (its compiler flags, and an AVX2+FMA clone picked at
// load time), so that the floor computes its statistics no slower than the capture does.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FAST_MOMENTS __attribute__((optimize("-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", \
                                             "-ffinite-math-only"), target_clones("arch=x86-64-v3", "default")))
#else
#define FAST_MOMENTS
#endif

template <typename T>
FAST_MOMENTS Moments moments(const T* __restrict x, int64_t n) {
  double sum = 0, squares = 0, low = (double)x[0], high = (double)x[0];
  for (int64_t i = 0; i < n; i++) {
    const double v = (double)x[i];
    sum += v; squares += v * v;
    low = v < low ? v : low; high = v > high ? v : high;
  }
  return {sum, squares, low, high};
}

struct Known { int64_t numel; uint32_t version; Moments m; };
struct Row { int32_t op; int32_t inputs; int32_t outputs; };

std::vector<Row> rows;
std::vector<Moments> stats;
std::vector<std::string> op_names;
std::unordered_map<std::string, int32_t> op_ids;
std::unordered_map<const void*, Known> known;         // by data pointer
std::unordered_map<const void*, int8_t> composite;    // op name's pointer -> whether only a composite
thread_local std::vector<int8_t> open_calls;          // per call in flight: whether it is a recorded op
thread_local int recording = 0;                       // recorded ops in flight (0 or 1)
at::CallbackHandle handle = 0;

bool float_tensor(const c10::IValue& value) {
  if (!value.isTensor()) return false;
  const at::Tensor& t = value.toTensor();
  return t.defined() && t.is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble) &&
         t.is_contiguous() && t.numel() > 0;
}

uint32_t version_of(const at::Tensor& t) { return t.is_inference() ? 0 : t._version(); }

Moments compute(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat ? moments(t.const_data_ptr<float>(), t.numel())
                                       : moments(t.const_data_ptr<double>(), t.numel());
}

const Moments& lookup(const at::Tensor& t) {
  auto& entry = known[t.const_data_ptr()];
  const uint32_t version = version_of(t);
  if (entry.numel != t.numel() || entry.version != version) entry = Known{t.numel(), version, compute(t)};
  return entry.m;
}

bool only_composite(const at::RecordFunction& fn) {
  const char* name = fn.name();
  auto found = composite.find(name);
  if (found != composite.end()) return found->second;
  int8_t value = 1;  // not a dispatcher op (a user range): never recorded
  if (auto op = fn.operator_name()) {
    auto handle = c10::Dispatcher::singleton().findOp(*op);
    value = handle && handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  }
  composite[name] = value;
  return value;
}

int32_t op_id(const char* name) {
  auto found = op_ids.find(name);
  if (found != op_ids.end()) return found->second;
  op_names.emplace_back(name);
  return op_ids[name] = (int32_t)op_names.size() - 1;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  int8_t recorded = fn.scope() == at::RecordScope::FUNCTION && recording == 0 && !only_composite(fn);
  if (recorded) {
    recording++;
    int32_t inputs = 0;
    for (const auto& value : fn.inputs())
      if (float_tensor(value)) { stats.push_back(lookup(value.toTensor())); inputs++; }
    rows.push_back(Row{op_id(fn.name()), inputs, 0});
  }
  open_calls.push_back(recorded);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (open_calls.empty()) return;  // began before `start`
  const int8_t recorded = open_calls.back();
  open_calls.pop_back();
  if (!recorded) return;
  recording--;
  int32_t outputs = 0;
  for (const auto& value : fn.outputs()) {
    if (!float_tensor(value)) continue;
    const at::Tensor& t = value.toTensor();
    known[t.const_data_ptr()] = Known{t.numel(), version_of(t), compute(t)};
    stats.push_back(known[t.const_data_ptr()].m);
    outputs++;
  }
  rows.back().outputs = outputs;
}

void start() {
  if (handle) return;
  handle = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                          .needsInputs(true)
                                          .needsOutputs(true)
                                          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

// Stop observing; the names of the ops recorded since the last call, in order; forget them.
std::vector<std::string> stop() {
  if (handle) at::removeCallback(handle);
  handle = 0;
  std::vector<std::string> names;
  names.reserve(rows.size());
  for (const auto& row : rows) names.push_back(op_names[row.op]);
  rows.clear(); stats.clear(); known.clear(); open_calls.clear(); recording = 0;
  return names;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("start", &start, "observe every dispatcher call of this thread");
  m.def("stop", &stop, "stop; the recorded ops' names, in order");
}

// rtrain's bridge to the parts of libtorch that tch does not expose: CPU/CUDA autocast with a
// chosen dtype, the channels-last memory format, and the gradient plumbing data-parallel
// training needs (gradients that live in communication buckets, and a call when each is ready). Every entry point catches every C++
// exception and returns it as a message (nullptr on success), which Rust turns into an error;
// nothing may unwind into Rust.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function_hook.h>
// function.h defines Node up to PyTorch 2.11 and includes node.h, where it moved, after.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace {

char* copy_message(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, message.c_str(), message.size() + 1);
  }
  return out;
}

template <typename F>
char* guarded(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const std::exception& e) {
    return copy_message(e.what());
  } catch (...) {
    return copy_message("unknown C++ exception");
  }
}

at::DeviceType device_type(int cuda) { return cuda != 0 ? at::kCUDA : at::kCPU; }

}  // namespace

extern "C" {

void rtrain_shim_free(char* message) { std::free(message); }

// Enters autocast to bfloat16 on this thread, as Python's `torch.autocast(..., dtype=bf16)`
// does: remembers the previous state for the matching exit and raises the nesting count.
char* rtrain_autocast_enter(int cuda, int* previous_enabled, int* previous_dtype) {
  return guarded([&] {
    auto device = device_type(cuda);
    *previous_enabled = at::autocast::is_autocast_enabled(device) ? 1 : 0;
    *previous_dtype = static_cast<int>(at::autocast::get_autocast_dtype(device));
    at::autocast::set_autocast_enabled(device, true);
    at::autocast::set_autocast_dtype(device, at::kBFloat16);
    at::autocast::increment_nesting();
  });
}

// Leaves autocast: at the outermost exit the cached low-precision copies of the weights are
// dropped (else the next step would see stale weights), then the previous state is restored.
char* rtrain_autocast_exit(int cuda, int previous_enabled, int previous_dtype) {
  return guarded([&] {
    auto device = device_type(cuda);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
    at::autocast::set_autocast_enabled(device, previous_enabled != 0);
    at::autocast::set_autocast_dtype(device, static_cast<at::ScalarType>(previous_dtype));
  });
}

// A channels-last copy (or the tensor itself if already so) of a 4-d tensor, as a new
// at::Tensor that the caller owns (tch's Tensor::from_ptr takes it over).
char* rtrain_channels_last(const at::Tensor* tensor, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(tensor->contiguous(at::MemoryFormat::ChannelsLast)); });
}

// Makes a parameter's data channels-last in place, keeping its identity (and so the optimizer's
// and the autograd graph's references to it).
char* rtrain_param_to_channels_last(at::Tensor* param) {
  return guarded([&] { param->set_data(param->contiguous(at::MemoryFormat::ChannelsLast)); });
}

// Deterministic mode: cuDNN's deterministic algorithms and no autotuning (which picks kernels
// by timing), and PyTorch's deterministic-algorithms switch, warning on an op that has no
// deterministic implementation rather than failing. Off: cuDNN autotuning for speed.
char* rtrain_set_deterministic(int on) {
  return guarded([&] {
    auto& context = at::globalContext();
    context.setDeterministicCuDNN(on != 0);
    context.setBenchmarkCuDNN(on == 0);
    context.setDeterministicAlgorithms(on != 0, /*warn_only=*/true);
  });
}

// Makes `grad` (a view into a communication bucket, shaped and strided like the parameter) the
// parameter's gradient. Backward then accumulates into it in place, so the bucket needs no
// packing: PyTorch DDP's `gradient_as_bucket_view`.
char* rtrain_set_grad(at::Tensor* param, const at::Tensor* grad) {
  return guarded([&] { param->mutable_grad() = *grad; });
}

typedef void (*rtrain_grad_ready_fn)(void* context, size_t index);

namespace {

// Calls back once the parameter's gradient has been accumulated in a backward pass.
struct GradReadyHook : torch::autograd::FunctionPostHook {
  GradReadyHook(rtrain_grad_ready_fn callback, void* context, size_t index)
      : callback(callback), context(context), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    callback(context, index);
    return outputs;
  }
  rtrain_grad_ready_fn callback;
  void* context;
  size_t index;
};

// A strong reference to a gradient accumulator node: std::shared_ptr up to PyTorch 2.11,
// c10::intrusive_ptr after. Named through decltype so the shim builds against either.
using NodeRef = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace

// Registers `callback(context, index)` to run after backward has accumulated the gradient of
// `param` (a leaf that requires grad), as DDP's reducer does on the AccumulateGrad node. The
// returned handle keeps that node, and with it the hook, alive: a parameter holds only a weak
// reference, and without one the node (and hook) would be re-created for every backward.
char* rtrain_grad_ready_hook(const at::Tensor* param, rtrain_grad_ready_fn callback, void* context,
                             size_t index, void** handle) {
  return guarded([&] {
    auto accumulator = torch::autograd::impl::grad_accumulator(*param);
    if (!accumulator) {
      throw std::runtime_error("the parameter has no gradient accumulator (is it a leaf requiring grad?)");
    }
    accumulator->add_post_hook(std::make_unique<GradReadyHook>(callback, context, index));
    *handle = new NodeRef(std::move(accumulator));
  });
}

// Releases a handle from rtrain_grad_ready_hook (the node goes with the last reference).
void rtrain_grad_ready_hook_free(void* handle) {
  delete static_cast<NodeRef*>(handle);
}

}  // extern "C"

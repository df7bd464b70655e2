// rtrain's bridge to the parts of libtorch that tch does not expose: CPU/CUDA autocast with a
// chosen dtype, the channels-last memory format, the gradient plumbing data-parallel
// training needs (gradients that live in communication buckets, and a call when each is ready)
// and SyncBatchNorm's autograd function. Every entry point catches every C++ exception and
// returns it as a message (nullptr on success), which Rust turns into an error; nothing may
// unwind into Rust.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function_hook.h>
// function.h defines Node up to PyTorch 2.11 and includes node.h, where it moved, after.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstring>
#include <exception>
#include <vector>
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

// A copy of a CPU tensor in pinned (page-locked) memory for the current accelerator, as a new
// at::Tensor the caller owns. Tensor::pin_memory(device) (what tch calls) warns on every call
// since PyTorch 2.9 that the device argument is deprecated.
char* rtrain_pin_memory(const at::Tensor* tensor, at::Tensor** out) {
  return guarded([&] { *out = new at::Tensor(tensor->pin_memory()); });
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

// TF32 (10-bit mantissa) inside fp32 work on Ampere and later GPUs: cuDNN's convolutions
// (PyTorch's default: on) and cuBLAS's matrix products (default: off). No effect on the CPU.
char* rtrain_set_tf32(int convolutions, int matrix_products) {
  return guarded([&] {
    auto& context = at::globalContext();
    context.setAllowTF32CuDNN(convolutions != 0);
    context.setAllowTF32CuBLAS(matrix_products != 0);
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

// ---- SyncBatchNorm ---------------------------------------------------------------------------

// Sums `len` doubles in place over every rank of the job (rtrain's communicator, in Rust).
typedef void (*rtrain_all_reduce_fn)(void* context, double* data, size_t len);

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Every dimension but the channels (1): what BatchNorm reduces over.
std::vector<int64_t> reduced_dims(const at::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

// Per-channel shape that broadcasts against the input: [1, C, 1, 1].
std::vector<int64_t> channel_shape(const at::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = x.size(1);
  return shape;
}

// Sums per-channel statistics (doubles, on any device) over the job; returns them on the
// input's device.
at::Tensor all_reduce(const at::Tensor& values, rtrain_all_reduce_fn fn, void* context) {
  auto host = values.to(at::kCPU, at::kDouble).contiguous();
  fn(context, host.data_ptr<double>(), static_cast<size_t>(host.numel()));
  return host.to(values.device());
}

// BatchNorm whose batch statistics cover every rank's batch, as torch.nn.SyncBatchNorm computes
// them (mean, biased variance for normalising, unbiased for the running estimate, over the total
// count), and whose backward sums the two gradient terms that depend on them over every rank.
// Statistics are reduced in float64 with two reductions (mean, then squared deviations), so the
// result equals one process's BatchNorm over the combined batch to rounding.
struct SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, at::Tensor running_mean, at::Tensor running_var,
                            double momentum, double eps, int64_t fn_bits, int64_t context_bits) {
    auto fn = reinterpret_cast<rtrain_all_reduce_fn>(fn_bits);
    auto context = reinterpret_cast<void*>(context_bits);
    auto x = input.to(at::kFloat);
    auto dims = reduced_dims(x);
    auto shape = channel_shape(x);
    int64_t channels = x.size(1);
    double local_count = static_cast<double>(x.numel() / std::max<int64_t>(channels, 1));

    auto sums = all_reduce(at::cat({x.sum(dims, false, at::kDouble),
                                    at::full({1}, local_count, x.options().dtype(at::kDouble))}),
                           fn, context);
    double count = sums[channels].item<double>();
    if (count < 2) throw std::runtime_error("SyncBatchNorm needs more than one value per channel over all ranks");
    auto mean = sums.slice(0, 0, channels) / count;
    auto centred = x - mean.to(at::kFloat).view(shape);
    auto squares = all_reduce(centred.pow(2).sum(dims, false, at::kDouble), fn, context);
    auto var = squares / count;
    auto invstd = (var + eps).rsqrt().to(at::kFloat);

    {
      at::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (count / (count - 1))).to(running_var.scalar_type()), momentum);
    }
    ctx->save_for_backward({input, mean.to(at::kFloat), invstd, weight});
    ctx->saved_data["count"] = count;
    ctx->saved_data["fn"] = fn_bits;
    ctx->saved_data["context"] = context_bits;
    auto out = centred * (invstd * weight.to(at::kFloat)).view(shape) + bias.to(at::kFloat).view(shape);
    return out.to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& mean = saved[1];
    const auto& invstd = saved[2];
    const auto& weight = saved[3];
    double count = ctx->saved_data["count"].toDouble();
    auto fn = reinterpret_cast<rtrain_all_reduce_fn>(ctx->saved_data["fn"].toInt());
    auto context = reinterpret_cast<void*>(ctx->saved_data["context"].toInt());

    auto x = input.to(at::kFloat);
    auto dy = grad_outputs[0].to(at::kFloat);
    auto dims = reduced_dims(x);
    auto shape = channel_shape(x);
    int64_t channels = x.size(1);
    auto centred = x - mean.view(shape);
    auto sum_dy = dy.sum(dims, false, at::kDouble);
    auto sum_dy_centred = (dy * centred).sum(dims, false, at::kDouble);
    // The parameters' gradients are this rank's own; data parallelism averages them as usual.
    auto grad_weight = (sum_dy_centred * invstd.to(at::kDouble)).to(weight.scalar_type());
    auto grad_bias = sum_dy.to(weight.scalar_type());

    auto sums = all_reduce(at::cat({sum_dy, sum_dy_centred}), fn, context);
    auto mean_dy = (sums.slice(0, 0, channels) / count).to(at::kFloat).view(shape);
    auto mean_dy_centred = (sums.slice(0, channels, 2 * channels) / count).to(at::kFloat).view(shape);
    auto invstd_b = invstd.view(shape);
    auto grad_input = (dy - mean_dy - centred * invstd_b * invstd_b * mean_dy_centred) * invstd_b *
                      weight.to(at::kFloat).view(shape);
    return {grad_input.to(input.scalar_type()), grad_weight, grad_bias, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(),  at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// Training-mode SyncBatchNorm over `input` (N, C, ...): returns the normalised output as a new
// tensor the caller owns, updating the running statistics in place. `fn(context, ...)` sums
// statistics over the job; it is called twice in forward and once in backward, on whichever
// thread runs them, and must stay valid while the autograd graph lives.
char* rtrain_sync_batch_norm(const at::Tensor* input, const at::Tensor* weight, const at::Tensor* bias,
                             at::Tensor* running_mean, at::Tensor* running_var, double momentum, double eps,
                             rtrain_all_reduce_fn fn, void* context, at::Tensor** out) {
  return guarded([&] {
    auto result = SyncBatchNormFunction::apply(*input, *weight, *bias, *running_mean, *running_var, momentum, eps,
                                               reinterpret_cast<int64_t>(fn), reinterpret_cast<int64_t>(context));
    *out = new at::Tensor(std::move(result));
  });
}

}  // extern "C"

// The executor's public face (executor.hpp). Inside it, Executor::Impl (exec/impl.hpp) runs
// the rank's stage Program: exec/setup.cpp builds it, exec/dispatch.cpp runs the op loop.
#include "stratagem/executor.hpp"

#include "src/runtime/exec/impl.hpp"

namespace stratagem {

Executor::Executor(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
                   const SampleSource& samples, ExecutorOptions options)
    : impl_(std::make_unique<Impl>(state, model, plan, backend, samples, std::move(options))) {}
Executor::~Executor() = default;
StepResult Executor::step(int64_t step) {
  return impl_->step(step);
}
Model& Executor::model() {
  return impl_->shards.model;
}
AdamW& Executor::optimizer() {
  return *impl_->shards.adamw;
}
const std::vector<FlatRun>& Executor::param_runs() const {
  return impl_->shards.sharding.all_weights;
}
Tensor& Executor::host_params() {
  return impl_->shards.host_params;
}
const std::vector<FlatRun>& Executor::optimizer_runs() const {
  return impl_->shards.sharding.all_state;
}
AdamW* Executor::host_optimizer() {
  return impl_->offload.adamw.get();
}
const Program& Executor::program() const {
  return impl_->program;
}
const StageProgram& Executor::stage_program() const {
  return *impl_->stage_program;
}
int64_t Executor::high_water_bytes() const {
  return impl_->buffers.ledger->high_water();
}
double Executor::moe_busiest_load() const {
  return impl_->moe_busiest_load;
}

Executor::MoeScratchUse Executor::moe_scratch_use() const {
  const exec::ScratchArena& a = impl_->buffers.moe_scratch;
  return {a.capacity_bytes(), a.peak_bytes(), a.overflow_bytes()};
}
int64_t Executor::host_high_water_bytes() const {
  return impl_->offload.ledger->high_water();
}
void Executor::weights_loaded() {
  impl_->offload.master_stale = true;
}

}  // namespace stratagem

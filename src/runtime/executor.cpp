// The executor's public face (executor.hpp). Inside it, Executor::Impl (exec/impl.hpp) runs
// the rank's stage Program: its RankContext (exec/setup.cpp builds it) holds what the rank
// keeps, its Dispatcher (exec/dispatch.cpp) runs the op loop on the op families' handlers.
#include "stratagem/executor.hpp"

#include "src/runtime/exec/impl.hpp"

namespace stratagem {

Executor::Executor(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
                   const SampleSource& samples, ExecutorOptions options)
    : impl_(std::make_unique<Impl>(state, model, plan, backend, samples, std::move(options))) {}
Executor::~Executor() = default;
StepResult Executor::step(int64_t step) {
  return impl_->dispatcher.step(step);
}
Model& Executor::model() {
  return impl_->rank.shards.model;
}
AdamW& Executor::optimizer() {
  return *impl_->rank.shards.adamw;
}
const std::vector<FlatRun>& Executor::param_runs() const {
  return impl_->rank.shards.sharding.all_weights;
}
Tensor& Executor::host_params() {
  return impl_->rank.shards.host_params;
}
const std::vector<FlatRun>& Executor::optimizer_runs() const {
  return impl_->rank.shards.sharding.all_state;
}
AdamW* Executor::host_optimizer() {
  return impl_->rank.offload.adamw.get();
}
const Program& Executor::program() const {
  return impl_->rank.program;
}
const StageProgram& Executor::stage_program() const {
  return *impl_->rank.stage_program;
}
int64_t Executor::high_water_bytes() const {
  return impl_->rank.buffers.ledger->high_water();
}
double Executor::moe_busiest_load() const {
  return impl_->rank.moe_busiest_load;
}

Executor::MoeScratchUse Executor::moe_scratch_use() const {
  const exec::ScratchArena& a = impl_->rank.buffers.moe_scratch;
  return {a.capacity_bytes(), a.peak_bytes(), a.overflow_bytes()};
}
int64_t Executor::host_high_water_bytes() const {
  return impl_->rank.offload.ledger->high_water();
}
void Executor::weights_loaded() {
  impl_->rank.offload.master_stale = true;
}

}  // namespace stratagem

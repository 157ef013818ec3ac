// The executor's parts on their own: Buffers finds a live buffer by the use the Program
// allocated it for (a layer's staged gradients by layer, a reduce-scatter's piece not at all)
// and forgets it at its free; Requests tells a landed transfer from one in flight; Shards
// finds a flat element's weights on the device or in the host pool.
#define BOOST_TEST_MODULE exec_parts
#include <boost/test/unit_test.hpp>
#include <stdexcept>

#include "src/runtime/exec/buffers.hpp"
#include "src/runtime/exec/requests.hpp"
#include "src/runtime/exec/shard_state.hpp"

using namespace stratagem;

namespace {
Op alloc_op(int buffer, MemCategory category, Block block, Phase phase, int layer, int mb) {
  Op op;
  op.kind = OpKind::alloc;
  op.buffer = buffer, op.category = category, op.block = block, op.phase = phase;
  op.layer = layer, op.microbatch = mb;
  return op;
}

// A transfer that lands when the test says so.
class Manual final : public Request {
 public:
  bool done = false;
  void wait() override { done = true; }
  bool test() override { return done; }
};
}  // namespace

BOOST_AUTO_TEST_CASE(buffers_are_found_by_their_use_until_freed) {
  auto backend = make_cpu_backend();
  exec::Buffers b(*backend);
  b.received_pieces.insert(7);
  const Op acts = alloc_op(3, MemCategory::activations, Block::mlp, Phase::forward, 2, 1);
  const Op staged = alloc_op(5, MemCategory::grads, Block::none, Phase::backward, 2, 1);
  const Op piece = alloc_op(7, MemCategory::buffers, Block::none, Phase::backward, 2, 1);
  for (const Op& op : {acts, staged, piece}) b.allocated(op);
  BOOST_TEST(b.of(Block::mlp, Phase::forward, 2, 1) == 3);
  BOOST_TEST(b.find(Block::mlp, Phase::forward, 2, 0) == -1);  // another micro-batch's
  BOOST_TEST(b.staging.at(2) == 5);
  BOOST_TEST(b.find(Block::none, Phase::backward, 2, 1) == -1);  // the piece: by its op only
  b.read_by(Block::mlp, Phase::forward, 2, 1, 40);
  b.read_by(Block::mlp, Phase::backward, 2, 1, 41);  // no such buffer: nothing waits
  BOOST_TEST(b.users.at(3) == std::vector<int>{40});
  BOOST_TEST(b.users.size() == 1u);
  for (const Op& op : {acts, staged, piece}) b.freed(op);
  BOOST_CHECK_THROW(b.of(Block::mlp, Phase::forward, 2, 1), std::logic_error);
  BOOST_TEST(b.staging.empty());
}

BOOST_AUTO_TEST_CASE(a_staging_free_keeps_a_newer_staging_buffer) {
  auto backend = make_cpu_backend();
  exec::Buffers b(*backend);
  const Op first = alloc_op(5, MemCategory::grads, Block::none, Phase::backward, 0, 0);
  const Op second = alloc_op(6, MemCategory::grads, Block::none, Phase::backward, 0, 1);
  b.allocated(first);
  b.allocated(second);  // the next micro-batch's, allocated before the first one's free
  b.freed(first);
  BOOST_TEST(b.staging.at(0) == 6);
}

BOOST_AUTO_TEST_CASE(requests_land_when_their_transfer_has) {
  exec::Requests r;
  auto owned = std::make_unique<Manual>();
  Manual* transfer = owned.get();
  int completions = 0;
  r.issue(4, std::move(owned), [&] { ++completions; });
  BOOST_TEST(!r.landed(4));
  BOOST_TEST(r.landed(5));  // never issued
  transfer->done = true;
  BOOST_TEST(r.landed(4));
  BOOST_TEST(completions == 0);  // landing is not completing: the dispatcher runs on_done
}

BOOST_AUTO_TEST_CASE(shards_find_weights_on_the_device_or_the_host) {
  auto backend = make_cpu_backend();
  exec::Shards s;
  // Flat [0, 4) on the device, [4, 10) offloaded.
  s.sharding.weights = exec::FlatMap({FlatRun{0, 4, 0, true, true, false}});
  s.sharding.host_weights = exec::FlatMap({FlatRun{4, 10, 0, true, true, true}});
  s.model.params = backend->allocate(Shape{4});
  s.host_params = backend->allocate(Shape{6});
  BOOST_TEST(s.param_slice(1, 2).data == s.model.params.data + 1);
  BOOST_TEST(s.param_slice(6, 3).data == s.host_params.data + 2);
}

// The executor's op handlers and the rank's context they share, declared for the references
// between them: exec/impl.hpp puts them together, each header says what its class holds or runs.
#pragma once

namespace stratagem::exec {

struct RankContext;  // what the rank runs and keeps (rank_context.hpp)
class Dispatcher;    // the op loop (dispatch.hpp)
class RunAhead;      // the prefetching streams (run_ahead.hpp)
class ComputeOps;    // ops_compute.hpp
class CommOps;       // ops_comm.hpp
class CpOps;         // ops_cp.hpp
class MoeOps;        // ops_moe.hpp
class OffloadOps;    // ops_offload.hpp

}  // namespace stratagem::exec

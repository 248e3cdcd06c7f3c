// dist_config: every rank of a distributed chapter (03-08) starts from the same configuration:
// the same parsed flags (a flag error on one rank stops them all) and rank 0's initial
// parameters, checked bit for bit. PyTorch DDP leaves the flags to the launcher and broadcasts
// the module state in its constructor.
// Leaves out: the data check (data_check.hpp), evaluation (dist_eval.hpp), the end-of-run
// report (dist.hpp).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "common/comm/comm.hpp"
#include "common/core/nn.hpp"

namespace ringzero {

/// parse_flags() for a job of several ranks: every rank learns whether every other rank parsed
/// its command line. A flag error on one rank only (it printed CLI11's message and would exit)
/// aborts every rank, instead of leaving the others waiting in their first collective.
/// Returns like parse_flags: an exit code to return now (all ranks saw --help, or all failed),
/// or -1 to carry on.
int parse_flags_on_every_rank(Communicator& comm, CLI::App& app, int argc, char** argv);

/// Start-up checks that each rank makes of its own machine (its output files, its
/// --checkpoint-dir): runs `checks` on this rank, then, collectively, every rank learns whether
/// any rank's checks failed and stops with the failing ranks' messages ("[rank 2/4] ...
/// --checkpoint-dir /local/ck is not writable"), so that one rank's unwritable node-local
/// directory stops the job before step 1, not after the last. comm null (one process): runs
/// `checks` and lets its error through. Every rank must call it at the same point.
void check_on_every_rank(Communicator* comm, const std::function<void()>& checks);

/// Start-up, before any other collective: checks that every rank parsed the same flags, and
/// aborts every rank naming the first flag that differs, with rank 0's value and the other
/// rank's ("rank 2 has lr=0.002, rank 0 has lr=0.001"). A job whose ranks train with different
/// learning rates, batch sizes or step counts either hangs in a collective or, worse, trains
/// on silently; PyTorch DDP has no such check and leaves it to the launcher. Flags named in
/// `checked_elsewhere` (e.g. "seed", verified through the parameters themselves) are skipped,
/// so the chapter's own check stays the one that reports them.
void verify_same_flags(Communicator& comm, const CLI::App& app,
                       const std::vector<std::string>& checked_elsewhere);

/// Start-up: broadcasts rank 0's parameters (Communicator::broadcast) and checks, on every
/// rank, that they equal the parameters this rank built itself (bit for bit). A rank started
/// with other weights (another --seed or --init-from) means a bug in the launch, not something
/// to paper over: every rank aborts, with a message naming the mismatching rank(s), the first
/// differing element and the fix. Same as PyTorch DDP's constructor, which broadcasts rank 0's
/// module state (and verifies the parameter shapes match across ranks).
void broadcast_and_verify_parameters(Communicator& comm, Model& model);

}  // namespace ringzero

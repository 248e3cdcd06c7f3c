// stream_log: what the emulated GPU layer (device_emul.cpp) records of the stream calls a host
// thread makes, since it has no streams to order: the serial number of the last event the thread
// recorded on its stream and of the last one its stream was made to wait for, and how often it
// synchronised its stream. device_emulation_test.cpp reads it to check the communication queue's
// hand-over (common/comm/comm_thread.hpp).
#pragma once

#include <cstdint>

namespace ringzero::emul {

struct StreamLog {
  uint64_t recorded = 0;      ///< the last event recorded on this thread's stream (1, 2, ...)
  uint64_t waited = 0;        ///< the last event this thread's stream waited for (0: none)
  uint64_t synchronized = 0;  ///< cudaStreamSynchronize calls on this thread's stream
};
/// The calling host thread's log.
StreamLog& stream_log();

}  // namespace ringzero::emul

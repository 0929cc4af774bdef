// edge_sensor_average: N small boards, one process each, average a sensor
// vector over Ethernet. The smallest cclite configuration:
//
//   - communicator<tcp::transport> only: no shared-memory transport is compiled
//     in (the program includes and links cclite::tcp, never cclite/cclite.hpp
//     or cclite::shm), so the binary carries one link type and one copy of
//     each algorithm;
//   - rendezvous through rank 0's TCP store at MASTER_ADDR:MASTER_PORT (or
//     CCLITE_RDZV_ENDPOINT), the only thing every board must know;
//   - small buffers: CCLITE_TCP_BUFFSIZE=64K CCLITE_NSOCKS=1 keep a board's
//     cclite memory to a few hundred KiB (see README "Footprint");
//   - it builds and runs with -fno-exceptions -fno-rtti, with
//     -DCCLITE_NO_THREADS, and for aarch64 / 32-bit ARM (tests/embedded.cmake).
//
// On each board (board k of N, board 0 at 192.168.1.10):
//
//   export RANK=k WORLD_SIZE=N MASTER_ADDR=192.168.1.10 MASTER_PORT=29400
//   CCLITE_SOCKET_IFNAME=eth0 ./edge_sensor_average
//
// or, to try it on one machine: build/bin/cclite-run --nproc-per-node 3
// build/bin/edge_sensor_average (peers on one host talk TCP over loopback).
//
// Each board reads `samples` readings of `channels` sensors (simulated: a
// value that depends on the board and the channel), and every board ends with
// the average of every channel over all boards: one allreduce with
// reduce_op::avg. It checks the result against the closed form and exits 1
// if it differs, so tests can run it.
#include <cclite/collective/init.hpp>
#include <cclite/tcp/transport.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

// A stand-in for reading an ADC: board b, channel c, sample s.
float read_sensor(int board, int channel, int sample) {
  return static_cast<float>(20 + board) + 0.5f * static_cast<float>(channel) +
         0.001f * static_cast<float>(sample % 7);
}

}  // namespace

int main() {
  using edge_comm = cclite::communicator<cclite::tcp::transport>;
  auto comm = cclite::init_communicator<edge_comm>();
  if (!comm) {
    std::fprintf(stderr, "edge_sensor_average: %s\n", comm.error().to_string().c_str());
    return 1;
  }
  edge_comm& c = *comm.value();
  const int board = c.rank(), boards = c.size();

  constexpr int channels = 16, samples = 100;
  // Local mean of each channel over this board's samples.
  std::vector<float> mean(channels, 0.0f);
  for (int ch = 0; ch < channels; ++ch) {
    float sum = 0;
    for (int s = 0; s < samples; ++s) sum += read_sensor(board, ch, s);
    mean[static_cast<std::size_t>(ch)] = sum / samples;
  }

  // Average over the boards, in place; every board gets the same bits.
  if (cclite::status st = c.allreduce(mean.data(), mean.size(), cclite::reduce_op::avg); !st.ok()) {
    std::fprintf(stderr, "board %d: %s\n", board, st.to_string().c_str());
    return 1;
  }

  // Closed form: the sample term averages to the same value on every board,
  // the board term to 20 + (boards - 1) / 2.
  float noise = 0;
  for (int s = 0; s < samples; ++s) noise += 0.001f * static_cast<float>(s % 7);
  noise /= samples;
  bool ok = true;
  for (int ch = 0; ch < channels; ++ch) {
    const float want = 20.0f + 0.5f * static_cast<float>(boards - 1) + 0.5f * static_cast<float>(ch) + noise;
    if (std::fabs(mean[static_cast<std::size_t>(ch)] - want) > 1e-3f) ok = false;
  }
  std::printf("board %d of %d via %s: channel 0 average %.4f, channel %d average %.4f (%s)\n", board,
              boards, boards > 1 ? c.transport_of(c.topo().ring_next(board)) : "self", mean[0],
              channels - 1, mean[channels - 1], ok ? "correct" : "WRONG");
  return ok ? 0 : 1;
}

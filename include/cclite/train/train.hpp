// cclite/train/train.hpp - everything of cclite::train: the data-parallel
// trainer layer (see DESIGN.md "train"), for a program that also includes
// <cclite/cclite.hpp> for the communicator.
//
//   data_parallel.hpp  parameter broadcast, gradient buckets allreduced while
//                      backward runs, no_sync accumulation, uneven inputs (join)
//   dp_options.hpp     its options (bucket caps, shared window, compression, ...)
//   grad_compression.hpp  gradients sent as fp16 / bf16 (DDP's compress hooks)
//   sharded_optimizer.hpp  the optimiser step sharded over a node's ranks and
//                      fused with the gradient reduction (ZeRO-1 on shared memory)
//   sampler.hpp        each rank's shard of a seeded, shuffled epoch
//   checkpoint.hpp     atomic, checksummed save; truncated/corrupt files refused
//   optim.hpp          SGD (momentum), AdamW; parameter/optimiser checkpointing
//   mlp.hpp, layers.hpp, gemm.hpp  Linear, ReLU, softmax cross-entropy over a
//                      CBLAS (OpenBLAS) or a portable fallback
//
// Link the CMake target cclite::train to get the BLAS (CCLITE_HAS_CBLAS);
// without it everything still works, with slow matrix products.
#pragma once

#include <cclite/train/bucket_plan.hpp>
#include <cclite/train/checkpoint.hpp>
#include <cclite/train/data_parallel.hpp>
#include <cclite/train/dp_options.hpp>
#include <cclite/train/grad_compression.hpp>
#include <cclite/train/gemm.hpp>
#include <cclite/train/layers.hpp>
#include <cclite/train/mlp.hpp>
#include <cclite/train/optim.hpp>
#include <cclite/train/parameter.hpp>
#include <cclite/train/random.hpp>
#include <cclite/train/sampler.hpp>
#include <cclite/train/sharded_optimizer.hpp>

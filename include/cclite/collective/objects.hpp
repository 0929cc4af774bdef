// cclite/collective/objects.hpp - collectives over data whose size only its
// owner knows: a string or a vector that one rank broadcasts, or that every
// rank contributes with a length of its own (torch.distributed's
// broadcast_object_list / all_gather_object, Horovod's broadcast_object, for
// C++ values that are bytes: std::string and std::vector of trivially copyable
// elements), and gathered to or scattered from one rank (gather_object,
// scatter_object_list).
//
//   std::string run_dir = comm.rank() == 0 ? make_run_dir() : "";
//   check(cclite::broadcast_string(comm, run_dir, 0));      // everyone has rank 0's
//   auto hosts = cclite::allgather_strings(comm, my_host).value();  // hosts[r]: rank r's
//   auto logs = cclite::gather_strings(comm, my_log, 0).value();    // on rank 0 only
//
// Each is two collectives on `comm`: the sizes (a broadcast of one uint64, an
// allgather, gather or scatter of one per rank), then the bytes (a broadcast,
// allgatherv, gatherv or scatterv; broadcast and allgatherv are skipped when
// there are none). Like every collective they are called by every rank of
// `comm` in the same order; a rank that passes another root gets
// errc::mismatch, as with comm.broadcast. Comm: cclite's communicator<...>
// (those collectives with a dtype).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cclite/core/dtype.hpp>
#include <cclite/core/status.hpp>

namespace cclite {

namespace detail {
/// Bytes of `n` elements of `elem` bytes, unless that overflows (a size
/// another rank sent that no vector here could hold).
inline status checked_bytes(std::uint64_t n, std::size_t elem, const char* what, std::size_t& bytes) {
  if (n > SIZE_MAX / 2 / elem)
    return make_error(errc::invalid_argument, "%s: %llu elements of %zu bytes cannot be held here", what,
                      static_cast<unsigned long long>(n), elem);
  bytes = static_cast<std::size_t>(n) * elem;
  return {};
}

/// The byte layout of vectors of `lengths` elements of `elem` bytes, back to
/// back: counts[r] bytes at displs[r], `total` in all.
inline status pack_layout(const std::vector<std::uint64_t>& lengths, std::size_t elem, const char* what,
                          std::vector<std::size_t>& counts, std::vector<std::size_t>& displs, std::size_t& total) {
  counts.resize(lengths.size());
  displs.resize(lengths.size());
  total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    CCLITE_TRY(checked_bytes(lengths[r], elem, what, counts[r]));
    if (counts[r] > SIZE_MAX / 2 - total)
      return make_error(errc::invalid_argument, "%s: the ranks' vectors add up to more than fits here", what);
    displs[r] = total;
    total += counts[r];
  }
  return {};
}

/// The vectors laid out by pack_layout, out of `all`.
template <class T>
std::vector<std::vector<T>> unpack(const std::vector<unsigned char>& all, const std::vector<std::uint64_t>& lengths,
                                   const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs) {
  std::vector<std::vector<T>> out(lengths.size());
  for (std::size_t r = 0; r < out.size(); ++r) {
    out[r].resize(static_cast<std::size_t>(lengths[r]));
    if (counts[r] > 0) std::memcpy(static_cast<void*>(out[r].data()), all.data() + displs[r], counts[r]);
  }
  return out;
}

/// Vectors of char as strings (the *_strings forms).
inline result<std::vector<std::string>> as_strings(result<std::vector<std::vector<char>>> bytes) {
  if (!bytes.ok()) return bytes.error();
  std::vector<std::string> out;
  out.reserve(bytes.value().size());
  for (const auto& b : bytes.value()) out.emplace_back(b.begin(), b.end());
  return {std::move(out)};  // nvcc: no implicit move into result<T> (CWG1579)
}
}  // namespace detail

namespace detail {
/// Root's size, then root's bytes, into `data` (a std::vector or std::string).
template <class Comm, class Container>
status broadcast_container(Comm& comm, Container& data, int root, const char* what) {
  std::uint64_t n = data.size();
  CCLITE_TRY(comm.broadcast(&n, 1, dtype::uint64, root));
  std::size_t bytes = 0;
  CCLITE_TRY(checked_bytes(n, sizeof(typename Container::value_type), what, bytes));
  if (comm.rank() != root) data.resize(static_cast<std::size_t>(n));
  if (bytes == 0) return {};
  return comm.broadcast(static_cast<void*>(data.data()), bytes, dtype::uint8, root);
}
}  // namespace detail

/// Makes every rank's `data` a copy of root's `data` (T trivially copyable;
/// the others' vectors are resized).
template <class Comm, class T>
status broadcast_vector(Comm& comm, std::vector<T>& data, int root) {
  static_assert(std::is_trivially_copyable_v<T>, "broadcast_vector: T must be trivially copyable");
  return detail::broadcast_container(comm, data, root, "broadcast_vector");
}

/// Makes every rank's `data` a copy of root's `data`.
template <class Comm>
status broadcast_string(Comm& comm, std::string& data, int root) {
  return detail::broadcast_container(comm, data, root, "broadcast_string");
}

/// Every rank's `mine`, in rank order, on every rank (lengths may differ,
/// including 0; T trivially copyable).
template <class Comm, class T>
result<std::vector<std::vector<T>>> allgather_vectors(Comm& comm, const std::vector<T>& mine) {
  static_assert(std::is_trivially_copyable_v<T>, "allgather_vectors: T must be trivially copyable");
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> lengths(ranks);
  const std::uint64_t my_length = mine.size();
  CCLITE_TRY(comm.allgather(&my_length, lengths.data(), 1, dtype::uint64));
  std::vector<std::size_t> counts, displs;
  std::size_t total = 0;
  CCLITE_TRY(detail::pack_layout(lengths, sizeof(T), "allgather_vectors", counts, displs, total));
  std::vector<unsigned char> all(total);
  if (total > 0)
    CCLITE_TRY(comm.allgatherv(static_cast<const void*>(mine.data()), counts[static_cast<std::size_t>(comm.rank())],
                               static_cast<void*>(all.data()), counts.data(), displs.data(), dtype::uint8));
  return detail::unpack<T>(all, lengths, counts, displs);
}

/// Every rank's `mine`, in rank order, on every rank.
template <class Comm>
result<std::vector<std::string>> allgather_strings(Comm& comm, const std::string& mine) {
  return detail::as_strings(allgather_vectors(comm, std::vector<char>(mine.begin(), mine.end())));
}

/// Every rank's `mine`, in rank order, on `root` (torch.distributed's
/// gather_object); the other ranks get an empty vector. Lengths may differ,
/// including 0; T trivially copyable. Two collectives: a gather of the
/// lengths, then a gatherv of the bytes.
template <class Comm, class T>
result<std::vector<std::vector<T>>> gather_vectors(Comm& comm, const std::vector<T>& mine, int root) {
  static_assert(std::is_trivially_copyable_v<T>, "gather_vectors: T must be trivially copyable");
  const bool is_root = comm.rank() == root;
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  std::vector<std::uint64_t> lengths(is_root ? ranks : 0);
  const std::uint64_t my_length = mine.size();
  CCLITE_TRY(comm.gather(&my_length, lengths.data(), 1, dtype::uint64, root));
  // Lengths of real vectors on their ranks: too large only for a root that
  // addresses less memory than a sender (a 32-bit board gathering from a
  // 64-bit host), which then reports it; the senders' gatherv ends at the deadline.
  std::vector<std::size_t> counts, displs;
  std::size_t total = 0;
  CCLITE_TRY(detail::pack_layout(lengths, sizeof(T), "gather_vectors", counts, displs, total));
  std::vector<unsigned char> all(total);
  CCLITE_TRY(comm.gatherv(static_cast<const void*>(mine.data()), mine.size() * sizeof(T),
                          static_cast<void*>(all.data()), counts.data(), displs.data(), dtype::uint8, root));
  return detail::unpack<T>(all, lengths, counts, displs);
}

/// Every rank's `mine`, in rank order, on `root`; empty elsewhere.
template <class Comm>
result<std::vector<std::string>> gather_strings(Comm& comm, const std::string& mine, int root) {
  return detail::as_strings(gather_vectors(comm, std::vector<char>(mine.begin(), mine.end()), root));
}

/// Rank r gets root's parts[r] (torch.distributed's scatter_object_list);
/// `parts` is read on the root only and must hold size() vectors there. A
/// root whose `parts` has another size gets invalid_argument and the other
/// ranks get invalid_argument naming the root (the lengths they receive say
/// so), never a wait. Two collectives: a scatter of the lengths, then a
/// scatterv of the bytes.
template <class Comm, class T>
result<std::vector<T>> scatter_vectors(Comm& comm, const std::vector<std::vector<T>>& parts, int root) {
  static_assert(std::is_trivially_copyable_v<T>, "scatter_vectors: T must be trivially copyable");
  constexpr std::uint64_t bad_parts = UINT64_MAX;  // a length no vector has: the root's arguments were wrong
  const bool is_root = comm.rank() == root;
  const std::size_t ranks = static_cast<std::size_t>(comm.size());
  const bool wrong = is_root && parts.size() != ranks;
  std::vector<std::uint64_t> lengths(is_root ? ranks : 0, bad_parts);
  std::vector<std::size_t> counts(lengths.size()), displs(lengths.size());
  std::vector<unsigned char> all;
  if (is_root && !wrong) {
    std::size_t total = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      lengths[r] = parts[r].size();
      counts[r] = parts[r].size() * sizeof(T);
      displs[r] = total;
      total += counts[r];
    }
    all.resize(total);
    for (std::size_t r = 0; r < ranks; ++r)
      if (counts[r] > 0) std::memcpy(all.data() + displs[r], static_cast<const void*>(parts[r].data()), counts[r]);
  }
  std::uint64_t my_length = 0;
  CCLITE_TRY(comm.scatter(lengths.data(), &my_length, 1, dtype::uint64, root));
  if (wrong)
    return make_error(errc::invalid_argument, "scatter_vectors: the root has %zu parts for %zu ranks", parts.size(),
                      ranks);
  if (my_length == bad_parts)
    return make_error(errc::invalid_argument, "scatter_vectors: the root (rank %d) was not given one part per rank",
                      root);
  std::size_t bytes = 0;
  CCLITE_TRY(detail::checked_bytes(my_length, sizeof(T), "scatter_vectors", bytes));
  std::vector<T> out(static_cast<std::size_t>(my_length));
  CCLITE_TRY(comm.scatterv(static_cast<const void*>(all.data()), counts.data(), displs.data(),
                           static_cast<void*>(out.data()), bytes, dtype::uint8, root));
  return {std::move(out)};  // nvcc: no implicit move into result<T> (CWG1579)
}

/// Rank r gets root's parts[r] (strings; `parts` read on the root only).
template <class Comm>
result<std::string> scatter_strings(Comm& comm, const std::vector<std::string>& parts, int root) {
  std::vector<std::vector<char>> bytes;
  if (comm.rank() == root) {
    bytes.reserve(parts.size());
    for (const auto& p : parts) bytes.emplace_back(p.begin(), p.end());
  }
  auto mine = scatter_vectors(comm, bytes, root);
  if (!mine.ok()) return mine.error();
  std::string out(mine.value().begin(), mine.value().end());
  return {std::move(out)};  // nvcc: no implicit move into result<T> (CWG1579)
}

}  // namespace cclite

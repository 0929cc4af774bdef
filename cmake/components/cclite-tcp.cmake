# cclite-tcp.cmake - component "tcp": cclite::tcp, the TCP transport and the TCP
# rendezvous store. Included by cclite-config.cmake; sets cclite_tcp_FOUND and,
# when FALSE, cclite_tcp_NOT_FOUND_MESSAGE.
#
# Needs standalone Asio (headers only) on the consumer's machine: Debian/Ubuntu
# libasio-dev, Fedora asio-devel, Homebrew asio, or any checkout passed as
# -DCCLITE_ASIO_INCLUDE_DIR=<dir containing asio.hpp>. Keep the definitions in
# step with transports/tcp/CMakeLists.txt.
if(TARGET cclite::tcp)
  set(cclite_tcp_FOUND TRUE)
  return()
endif()

find_path(CCLITE_ASIO_INCLUDE_DIR asio.hpp
  DOC "Directory holding standalone Asio's asio.hpp (Debian/Ubuntu: libasio-dev)")
if(NOT CCLITE_ASIO_INCLUDE_DIR)
  set(cclite_tcp_FOUND FALSE)
  string(CONCAT cclite_tcp_NOT_FOUND_MESSAGE
      "cclite::tcp needs standalone Asio, and asio.hpp was not found. Install it "
      "('apt-get install libasio-dev' on Debian/Ubuntu, 'dnf install asio-devel' on Fedora), "
      "or pass -DCCLITE_ASIO_INCLUDE_DIR=<dir containing asio.hpp>.")
  return()
endif()

add_library(cclite::tcp INTERFACE IMPORTED)
set_target_properties(cclite::tcp PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${CCLITE_ASIO_INCLUDE_DIR}"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${CCLITE_ASIO_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "CCLITE_HAS_TCP=1;ASIO_STANDALONE;ASIO_NO_DEPRECATED"
  INTERFACE_LINK_LIBRARIES "cclite::core;Threads::Threads")
set(cclite_tcp_FOUND TRUE)

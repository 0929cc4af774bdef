# cclite-tcp.cmake - component "tcp": cclite::tcp, the TCP transport and the TCP
# rendezvous store. Included by cclite-config.cmake; sets cclite_tcp_FOUND.
#
# Plain POSIX sockets: nothing to find beyond Threads (the store server's
# optional background thread). Keep the definitions in step with
# transports/tcp/CMakeLists.txt.
if(TARGET cclite::tcp)
  set(cclite_tcp_FOUND TRUE)
  return()
endif()

add_library(cclite::tcp INTERFACE IMPORTED)
set_target_properties(cclite::tcp PROPERTIES
  INTERFACE_COMPILE_DEFINITIONS "CCLITE_HAS_TCP=1"
  INTERFACE_LINK_LIBRARIES "cclite::core;Threads::Threads")
set(cclite_tcp_FOUND TRUE)

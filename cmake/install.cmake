# install rules: see cmake/install.cmake

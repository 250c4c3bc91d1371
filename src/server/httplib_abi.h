// cpp-httplib, included the way the installed library was built. Debian's libcpp-httplib is built
// with OpenSSL, zlib and Brotli support, and its header's classes change layout with those macros
// (httplib::Client gains a member, Request and ClientImpl others): an includer that leaves them
// undefined builds objects of the wrong size, and the library writes past their end. Every file
// includes httplib through this header. (libcpp-httplib-dev depends on the three -dev packages,
// so their headers are there wherever httplib is.)
#pragma once

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>

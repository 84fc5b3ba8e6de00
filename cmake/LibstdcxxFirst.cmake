# actcap_link_libstdcxx_first(TARGET): every program or shared object linking TARGET gets the shared
# libstdc++ linked by path as its first NEEDED library.
#
# Why: pip's LibTorch (2.5 on) exports its own copies of some libstdc++ symbols (std::filesystem,
# locale facet ids: pytorch/pytorch#133437). Where libtorch is searched before the shared libstdc++,
# or where the compiler links libstdc++ statically (the GPU image's GCC has only libstdc++.a), part
# of our code binds to those copies and the rest does not: on torch 2.11, std::filesystem::remove_all
# jumped to null and an ostream picked the wrong locale facet (docs/gpu.md). Linked first, the
# shared libstdc++ defines every std symbol at link time and is searched first at run time.
#
# ACTCAP_LIBSTDCXX: the library to link (empty: the compiler's libstdc++.so, else the system's
# libstdc++.so.6; OFF: none). tests/python/test_libstdcxx_first.py checks both ways of finding it.
set(ACTCAP_LIBSTDCXX "" CACHE STRING
    "The shared libstdc++ linked first (empty: found; OFF: none)")

function(actcap_link_libstdcxx_first target)
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang"
     OR ACTCAP_LIBSTDCXX STREQUAL "OFF")
    return()
  endif()
  set(lib "${ACTCAP_LIBSTDCXX}")
  foreach(name IN ITEMS libstdc++.so libstdc++.so.6)
    if(NOT lib)
      execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${name}
                      OUTPUT_VARIABLE found OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      # a bare name back: the compiler has no such file in its paths
      if(IS_ABSOLUTE "${found}" AND EXISTS "${found}")
        set(lib "${found}")
      endif()
    endif()
  endforeach()
  if(NOT lib)
    # the compiler's own link directories first (a multiarch /usr/lib/<arch> among them), then the
    # system's; not the prefixes given for LibTorch or the GPU kit's bundle
    find_library(ACTCAP_SYSTEM_LIBSTDCXX NAMES libstdc++.so.6 HINTS ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES}
                 NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH)
    if(ACTCAP_SYSTEM_LIBSTDCXX)
      set(lib "${ACTCAP_SYSTEM_LIBSTDCXX}")
    endif()
  endif()
  if(NOT lib)
    message(WARNING "actcap: no shared libstdc++ found (set ACTCAP_LIBSTDCXX to its path): against "
                    "pip's LibTorch a statically linked libstdc++ can bind to libtorch's copies and crash")
    return()
  endif()
  message(STATUS "actcap: ${lib} linked first")
  # The installed package keeps the path too (as it keeps LibTorch's): -lstdc++ would find the
  # static archive again with a compiler such as the GPU image's.
  target_link_options(${target} INTERFACE "LINKER:--push-state,--no-as-needed,${lib},--pop-state")
endfunction()

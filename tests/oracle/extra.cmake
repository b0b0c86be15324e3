# The llama.cpp reference oracle (docs: docs/reference-oracle.md). rp-oracle is built only when
# scripts/fetch-oracle.sh has put the prebuilt npm libraries and the headers into RP_ORACLE_DIR; test_oracle
# (and any test that needs the oracle) gets RP_ORACLE_BIN / RP_ORACLE_BINS only then, and otherwise skips
# locally and fails in CI (CI=true).
set(RP_ORACLE_DIR "${CMAKE_SOURCE_DIR}/.oracle" CACHE PATH "scripts/fetch-oracle.sh output: bins/ and llama.cpp/ headers")
set(_rp_oracle_bins "${RP_ORACLE_DIR}/bins")
set(_rp_oracle_src "${RP_ORACLE_DIR}/llama.cpp")

if(EXISTS "${_rp_oracle_bins}/libllama.v0.4.0.so" AND EXISTS "${_rp_oracle_bins}/libggml.v0.4.0.so"
   AND EXISTS "${_rp_oracle_bins}/libggml-base.so" AND EXISTS "${_rp_oracle_src}/include/llama.h"
   AND EXISTS "${_rp_oracle_src}/ggml/include/ggml-backend.h")
  # Imported targets with the exact files (the versioned names have no lib*.so development symlink; each
  # library has a SONAME, so the program records plain names and finds them through its RPATH).
  set(_rp_oracle_libs)
  foreach(_lib llama.v0.4.0 ggml.v0.4.0 ggml-base)
    string(REPLACE "." "_" _name "rp_oracle_${_lib}")
    if(NOT TARGET ${_name})
      add_library(${_name} SHARED IMPORTED)
      set_target_properties(${_name} PROPERTIES IMPORTED_LOCATION "${_rp_oracle_bins}/lib${_lib}.so")
    endif()
    list(APPEND _rp_oracle_libs ${_name})
  endforeach()

  add_executable(rp-oracle ${CMAKE_CURRENT_LIST_DIR}/program/oracle.cpp)
  set_target_properties(rp-oracle PROPERTIES
    CXX_STANDARD 17
    RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin"
    BUILD_RPATH "${_rp_oracle_bins}"
    INSTALL_RPATH "${_rp_oracle_bins}")
  # llama.h / ggml.h are third-party: -isystem keeps their warnings out of our -Werror. No rp_flags (no
  # sanitizer, no -march=native): the oracle is a test tool around prebuilt libraries, not our code.
  target_include_directories(rp-oracle SYSTEM PRIVATE "${_rp_oracle_src}/include" "${_rp_oracle_src}/ggml/include")
  target_compile_options(rp-oracle PRIVATE -Wall -Wextra -Wshadow=local $<$<BOOL:${RP_WERROR}>:-Werror>)
  target_compile_definitions(rp-oracle PRIVATE RP_ORACLE_DEFAULT_BINS="${_rp_oracle_bins}")
  target_link_libraries(rp-oracle PRIVATE ${_rp_oracle_libs})

  set(RP_ORACLE_FOUND ON)
  set(RP_ORACLE_BIN "${CMAKE_BINARY_DIR}/bin/rp-oracle")
  message(STATUS "ggml-rp: llama.cpp oracle from ${RP_ORACLE_DIR} -> ${RP_ORACLE_BIN}")
else()
  set(RP_ORACLE_FOUND OFF)
  message(STATUS "ggml-rp: llama.cpp oracle not found in ${RP_ORACLE_DIR} (run scripts/fetch-oracle.sh); "
                 "oracle tests will skip (fail when CI=true)")
endif()

# Every test program (any tests/<area>/) may use the oracle: at the end of tests/ (when all test_* targets
# exist) each gets RP_ORACLE_BIN / RP_ORACLE_BINS and a build dependency on rp-oracle. Helper: oracle_run.h.
if(RP_ORACLE_FOUND)
  function(rp_oracle_add_to_tests)
    get_property(_targets DIRECTORY "${CMAKE_CURRENT_SOURCE_DIR}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(_t IN LISTS _targets)
      if(_t MATCHES "^test_")
        target_compile_definitions(${_t} PRIVATE RP_ORACLE_BIN="${RP_ORACLE_BIN}" RP_ORACLE_BINS="${_rp_oracle_bins}")
        add_dependencies(${_t} rp-oracle)
      endif()
    endforeach()
  endfunction()
  cmake_language(DEFER CALL rp_oracle_add_to_tests)
endif()

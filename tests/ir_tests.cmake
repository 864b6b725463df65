# Golden and error-corpus IR tests, one CTest test per file (included by tests/CMakeLists.txt).
#   tests/ir/golden/*.tir: `// RUN: <tpc opt args>` then FileCheck lines; run by tests/run_golden.sh.
#   tests/ir/errors/*.tir: `// ERROR: <the one expected stderr line>` (optional `// ARGS:`); run_error.sh.
# %plugin_dir is build/examples (the example plugin), %test_plugins build/tests/plugins (bad plugins).
find_program(FileCheck NAMES FileCheck-14 FileCheck PATHS /usr/lib/llvm-14/bin REQUIRED)

# Builds every plugin the tests load (a fixture: `ctest` works even when only tpc was built).
add_test(NAME ir.build_plugins
  COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target tpc tpc_test_plugins)
set_tests_properties(ir.build_plugins PROPERTIES FIXTURES_SETUP tpc_plugins RESOURCE_LOCK tpc_build)

set(TPC_IR_TEST_SUBST
  "%plugin_dir=${CMAKE_BINARY_DIR}/examples" "%test_plugins=${TPC_TEST_PLUGIN_DIR}")

file(GLOB TPC_GOLDEN_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ir/golden/*.tir)
foreach(f ${TPC_GOLDEN_TESTS})
  get_filename_component(n ${f} NAME_WE)
  add_test(NAME ir.golden.${n}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_golden.sh $<TARGET_FILE:tpc> ${FileCheck} ${f} ${TPC_IR_TEST_SUBST})
  set_tests_properties(ir.golden.${n} PROPERTIES FIXTURES_REQUIRED tpc_plugins)
endforeach()

file(GLOB TPC_ERROR_TESTS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/ir/errors/*.tir)
foreach(f ${TPC_ERROR_TESTS})
  get_filename_component(n ${f} NAME_WE)
  add_test(NAME ir.error.${n}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_error.sh $<TARGET_FILE:tpc> ${f} ${TPC_IR_TEST_SUBST})
  set_tests_properties(ir.error.${n} PROPERTIES FIXTURES_REQUIRED tpc_plugins)
endforeach()

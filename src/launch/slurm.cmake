# SLURM launcher tests (included from CMakeLists.txt).
monarch_add_test(slurm_test SOURCES slurm.test.cpp LIBS monarch_launch)
target_compile_definitions(slurm_test PRIVATE MONARCH_LAUNCH_TESTDATA="${CMAKE_CURRENT_SOURCE_DIR}/testdata")

# End to end on a real single-node SLURM cluster (scripts/slurm-local.sh), started and stopped by
# the fixture slurm_cluster; one cluster per build dir, on ports derived from its path. Without root
# the fixture does nothing and the test skips.
string(MD5 _slurm_hash "${CMAKE_BINARY_DIR}")
string(SUBSTRING "${_slurm_hash}" 0 3 _slurm_hash)
math(EXPR _slurm_port "17000 + (0x${_slurm_hash} % 400) * 2")
set(_slurm_env MONARCH_SLURM_DIR=${CMAKE_BINARY_DIR}/slurm-cluster MONARCH_SLURM_PORT=${_slurm_port}
    SLURM_CONF=${CMAKE_BINARY_DIR}/slurm-cluster/slurm.conf)
set_property(GLOBAL PROPERTY MONARCH_SLURM_ENV "${_slurm_env}")  # python_slurm_test's too
set(_slurm_script ${PROJECT_SOURCE_DIR}/scripts/slurm-local.sh)
add_test(NAME slurm_cluster_start COMMAND sh -c "if [ $(id -u) -ne 0 ] || ! command -v slurmctld >/dev/null; then echo 'not root or no slurm: no cluster (slurm_e2e_test skips)'; exit 0; fi; exec ${_slurm_script} start")
add_test(NAME slurm_cluster_stop COMMAND sh -c "if [ $(id -u) -ne 0 ] || ! command -v slurmctld >/dev/null; then exit 0; fi; exec ${_slurm_script} stop")
set_tests_properties(slurm_cluster_start PROPERTIES FIXTURES_SETUP slurm_cluster ENVIRONMENT "${_slurm_env}" TIMEOUT 60)
set_tests_properties(slurm_cluster_stop PROPERTIES FIXTURES_CLEANUP slurm_cluster ENVIRONMENT "${_slurm_env}" TIMEOUT 60)
monarch_add_test(slurm_e2e_test SOURCES slurm_e2e.test.cpp LIBS monarch_launch LABELS concurrency TIMEOUT 120)
target_compile_definitions(slurm_e2e_test PRIVATE MONARCH_CLI="$<TARGET_FILE:monarch>")
add_dependencies(slurm_e2e_test monarch)
set_tests_properties(slurm_e2e_test PROPERTIES FIXTURES_REQUIRED slurm_cluster ENVIRONMENT "${_slurm_env}")

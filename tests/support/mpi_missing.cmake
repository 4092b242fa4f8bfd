# tests/support/mpi_missing.cmake — the command of every mpi test entry when CMake found no MPI:
# it fails, naming the test and how to get MPI, so a machine without MPI shows the tests it
# could not run as failures instead of silently running fewer tests.
# Usage: cmake -DTEST=name -DRANKS=n -P mpi_missing.cmake
message(FATAL_ERROR
  "${TEST}: this test runs ${RANKS} ranks under mpirun, but CMake found no MPI when strata was "
  "configured, so it cannot run.\n"
  "hint: install Open MPI (apt-get install libopenmpi-dev openmpi-bin, or run "
  "scripts/install-deps.sh as root), then run cmake again on this build directory and rebuild")

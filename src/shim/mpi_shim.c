/* What the mpi crate's bindings do not carry, taken from the mpi.h rtrain is built against:
 * MPI_IN_PLACE, which differs between implementations (Open MPI: (void*)1, MPICH: (void*)-1),
 * and which implementation it is (Open MPI's collective tuning is set through its MCA
 * variables). */
#include <mpi.h>

void *rtrain_mpi_in_place(void) { return MPI_IN_PLACE; }

int rtrain_mpi_is_open_mpi(void) {
#ifdef OPEN_MPI
  return 1;
#else
  return 0;
#endif
}

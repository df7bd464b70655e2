/* MPI_IN_PLACE differs between MPI implementations (Open MPI: (void*)1, MPICH: (void*)-1) and
 * the mpi crate's bindings do not carry it, so take it from the mpi.h rtrain is built against. */
#include <mpi.h>

void *rtrain_mpi_in_place(void) { return MPI_IN_PLACE; }

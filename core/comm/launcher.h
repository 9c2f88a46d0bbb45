// launcher.h: what the environment says about how this process was started.
#pragma once

// The world size a launcher (OpenMPI's mpirun / PRRTE, MPICH's Hydra, another PMI/PMIx launcher) gave this
// process through its environment, at least rank + 1 where only the rank is given; 0 when no launcher
// variable is set (a plain `./train_gpt_cpu`).
int launcher_ranks(void);

from specdec_kernels.bench.cli import main

main()

from experiments.coupled import main

main()

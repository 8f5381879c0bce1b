from lumion_hil.harness.cli import main

main()

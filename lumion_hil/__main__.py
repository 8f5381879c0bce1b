from lumion_hil.cli import main

main()

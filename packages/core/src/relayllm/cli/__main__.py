from relayllm.cli import main

main(prog_name="relayllm")

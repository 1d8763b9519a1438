from agents_app.cli import main

main()

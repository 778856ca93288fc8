import sys

from export.moss_tts_nano.stand_in import main

sys.exit(main())

import sys

from export.moss_tts_nano.build import main

sys.exit(main())

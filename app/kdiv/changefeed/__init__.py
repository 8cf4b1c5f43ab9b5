"""TiCDC changefeed topics: their records decoded and their row checksums verified (`kdiv.ticdc`)."""

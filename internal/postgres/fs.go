package postgres

import "io/fs"

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic("postgres: embedded migrations: " + err.Error())
	}
	return sub
}

module inet.af/peercred

go 1.16
